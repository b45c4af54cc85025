package harness

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/dispatcher/authconf"
	"github.com/mlsched/mlsched/shared/natsconn"
)

// Auth is the NATS authorization of servers started with it: the auth.conf
// and seeds of `mlsched auth init`, plus a harness user with every
// permission for the test's own checks (never given to a process).
type Auth struct {
	// Dir holds auth.conf and the seed files.
	Dir string
	// Nodes are the node ids that have a key.
	Nodes []string

	user, password string
}

// NewAuth writes in dir what `mlsched auth init -dir dir -nodes ...` writes
// (auth.conf and one seed per role and node) and makes up the harness user.
// Servers started with it include the auth.conf (see StartNATSAuth,
// NATSClusterOptions.Auth).
func NewAuth(dir string, nodes []string) (*Auth, error) {
	if _, err := authconf.Init(dir, nodes, nil); err != nil {
		return nil, err
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return &Auth{Dir: dir, Nodes: nodes, user: "e2e-harness", password: hex.EncodeToString(b)}, nil
}

// EnableAuth makes StartNATS include the auth.conf `mlsched auth init`
// writes for nodes, and every process connect with its role's key
// (MLSCHED_NATS_NKEY). Call it before StartNATS.
func (c *Cluster) EnableAuth(nodes ...string) *Auth {
	c.t.Helper()
	a, err := NewAuth(filepath.Join(c.Dir, "auth"), nodes)
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.auth = a
	c.mu.Unlock()
	return a
}

// Role returns the connection configuration of a role (authconf.Dispatcher,
// Producer, Admin) or of node id, for the cluster's NATS server.
func (a *Auth) Role(c *Cluster, role, nodeID string) natsconn.Config {
	return natsconn.Config{URL: c.NATSURL(), Nkey: a.Seed(role, nodeID)}
}

// Seed is the seed file of a role (authconf.Dispatcher, Producer, Admin),
// or of node nodeID when role is authconf.Node.
func (a *Auth) Seed(role, nodeID string) string {
	return authconf.Identity{Role: role, NodeID: nodeID}.SeedFile(a.Dir)
}

// conf is auth.conf with the harness user added.
func (a *Auth) conf() ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(a.Dir, authconf.ConfFile))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndex(s, "  ]\n}")
	harness := "    # the e2e harness's own connection: every permission\n    { user: \"" + a.user + "\", password: \"" + a.password + "\" }\n"
	return []byte(s[:i] + harness + s[i:]), nil
}

// include writes the authorization (with the harness user) into dir, next
// to a server's nats.conf, and returns the line that includes it.
func (a *Auth) include(dir string) (string, error) {
	ac, err := a.conf()
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, authconf.ConfFile), ac, 0o600); err != nil {
		return "", err
	}
	return "include " + authconf.ConfFile + "\n", nil
}

// HarnessUser is the connection option of the harness user, which may do
// anything: for a test's or a benchmark's own checks and observers, never
// for a process under test.
func (a *Auth) HarnessUser() nats.Option { return nats.UserInfo(a.user, a.password) }

func (a *Auth) natsOption() nats.Option { return a.HarnessUser() }

// env adds the seed of an identity to a process environment.
func (a *Auth) env(env map[string]string, id authconf.Identity) {
	env["MLSCHED_NATS_NKEY"] = id.SeedFile(a.Dir)
}
