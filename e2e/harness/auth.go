package harness

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/mlsched/mlsched/shared/authconf"
	"github.com/mlsched/mlsched/shared/natsconn"
)

// Auth is the NATS authorization of a cluster started after EnableAuth:
// the auth.conf and seeds of `mlsched auth init`, plus a harness user with
// every permission for the test's own checks (never given to a process).
type Auth struct {
	// Dir holds auth.conf and the seed files.
	Dir string
	// Nodes are the node ids that have a key.
	Nodes []string

	user, password string
}

// EnableAuth makes StartNATS include the auth.conf `mlsched auth init`
// writes for nodes, and every process connect with its role's key
// (MLSCHED_NATS_NKEY). Call it before StartNATS.
func (c *Cluster) EnableAuth(nodes ...string) *Auth {
	c.t.Helper()
	dir := filepath.Join(c.Dir, "auth")
	if _, err := authconf.Init(dir, nodes, nil); err != nil {
		c.t.Fatal(err)
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	a := &Auth{Dir: dir, Nodes: nodes, user: "e2e-harness", password: hex.EncodeToString(b)}
	c.mu.Lock()
	c.auth = a
	c.mu.Unlock()
	return a
}

// Role returns the connection configuration of a role (authconf.Dispatcher,
// Producer, Admin) or of node id, for the cluster's NATS server.
func (a *Auth) Role(c *Cluster, role, nodeID string) natsconn.Config {
	id := authconf.Identity{Role: role, NodeID: nodeID}
	return natsconn.Config{URL: c.NATSURL(), Nkey: id.SeedFile(a.Dir)}
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

func (a *Auth) natsOption() nats.Option { return nats.UserInfo(a.user, a.password) }

// env adds the seed of an identity to a process environment.
func (a *Auth) env(env map[string]string, id authconf.Identity) {
	env["MLSCHED_NATS_NKEY"] = id.SeedFile(a.Dir)
}
