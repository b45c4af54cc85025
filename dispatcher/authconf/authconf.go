// Package authconf writes the NATS authorization of an mlsched deployment:
// one nkey per role and a nats-server configuration fragment (auth.conf)
// granting each role only what its job needs. `mlsched auth init` is its
// command line; docs/security.md explains the roles.
//
// Roles:
//
//   - node <id>: pull from its own dispatch consumer, acknowledge its own
//     dispatches, publish its own outcomes and heartbeat, receive replies on
//     its own inbox prefix. It cannot see another node's dispatches.
//   - producer: submit tasks and read results.
//   - dispatcher: its streams and buckets; it answers admin requests.
//   - admin: the CLI's stats, nodes and dlq commands, plus the producer's.
//
// Nobody else gets in: the fragment defines users, so anonymous
// connections are refused.
package authconf

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/mlsched/mlsched/shared/natsconn"
	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// Role names.
const (
	Dispatcher = "dispatcher"
	Producer   = "producer"
	Admin      = "admin"
	Node       = "node"
)

// ConfFile is the fragment's file name, included by nats.conf with
// `include auth.conf`.
const ConfFile = "auth.conf"

// Permissions of one user, as nats-server applies them.
type Permissions struct {
	Publish, Subscribe []string
	// AllowResponses lets the user answer requests it received (one reply
	// each), whatever their reply subject.
	AllowResponses bool
}

// Identity is one user: a role, and for nodes the node id.
type Identity struct {
	Role   string
	NodeID string
}

// Name is the identity's seed file base name: the role, or node-<id>.
func (i Identity) Name() string {
	if i.Role == Node {
		return "node-" + i.NodeID
	}
	return i.Role
}

// SeedFile is where Init writes the identity's nkey seed in dir.
func (i Identity) SeedFile(dir string) string { return filepath.Join(dir, i.Name()+".nk") }

// kvStream is the stream behind a KV bucket.
func kvStream(bucket string) string { return "KV_" + bucket }

// subjectAdminAll are the core-NATS request subjects dispatchers answer
// (protocol.SubjectAdminStats, SubjectAdminCancel).
const subjectAdminAll = "mlsched.admin.>"

var (
	kvNodes      = kvStream(topology.BucketNodes)
	kvSuperseded = kvStream(topology.BucketSuperseded)
	kvDispatcher = kvStream(topology.BucketDispatcher)
	kvRollouts   = kvStream(topology.BucketRollouts)
	kvAutoscale  = kvStream(topology.BucketAutoscale)
	kvPipeline   = kvStream(topology.BucketPipeline)
)

// streamAPI grants the JetStream API verbs on stream s.
func streamAPI(s string, verbs ...string) []string {
	out := make([]string, 0, len(verbs))
	for _, v := range verbs {
		switch v {
		case "consume": // durable or ordered pull consumers, any name and filter
			out = append(out, "$JS.API.CONSUMER.CREATE."+s+".>", "$JS.API.CONSUMER.INFO."+s+".*",
				"$JS.API.CONSUMER.MSG.NEXT."+s+".*", "$JS.API.CONSUMER.DELETE."+s+".*", "$JS.FC."+s+".>")
		case "ack":
			out = append(out, "$JS.ACK."+s+".>")
		case "get": // by sequence or last per subject, direct or not
			out = append(out, "$JS.API.STREAM.MSG.GET."+s, "$JS.API.DIRECT.GET."+s, "$JS.API.DIRECT.GET."+s+".>")
		default: // INFO, CREATE, UPDATE, PURGE, MSG.DELETE
			out = append(out, "$JS.API.STREAM."+v+"."+s)
		}
	}
	return out
}

// For returns the permissions of an identity.
func For(id Identity) (Permissions, error) {
	switch id.Role {
	case Dispatcher:
		return dispatcherPerms(), nil
	case Producer:
		return producerPerms(), nil
	case Admin:
		return adminPerms(), nil
	case Node:
		if err := protocol.ValidToken(id.NodeID, 64); err != nil {
			return Permissions{}, fmt.Errorf("node id %q: %w", id.NodeID, err)
		}
		return nodePerms(id.NodeID), nil
	}
	return Permissions{}, fmt.Errorf("unknown role %q", id.Role)
}

func dispatcherPerms() Permissions {
	p := Permissions{AllowResponses: true}
	for _, s := range []string{topology.StreamTasks, topology.StreamDispatch, topology.StreamOutcomes,
		topology.StreamResults, topology.StreamDLQ, kvNodes, kvSuperseded, kvDispatcher, kvRollouts, kvPipeline} {
		p.Publish = append(p.Publish, streamAPI(s, "INFO", "CREATE", "UPDATE", "consume", "ack", "get")...)
	}
	p.Publish = append(p.Publish,
		"$JS.API.INFO",
		"$JS.API.STREAM.MSG.DELETE."+topology.StreamDispatch, // the sweeper deletes lost dispatches
		// Finished tasks are removed in batches (a limits-retention task
		// stream: dispatcher/taskprune.go), a straggler or a cancelled
		// task one by one.
		"$JS.API.STREAM.PURGE."+topology.StreamTasks, "$JS.API.STREAM.MSG.DELETE."+topology.StreamTasks,
		// An empty attempt stream is re-created on the configured storage
		// (topology.migrateStorage): it holds no task, only attempts.
		"$JS.API.STREAM.DELETE."+topology.StreamDispatch, "$JS.API.STREAM.DELETE."+topology.StreamOutcomes,
		topology.SubjectDispatchAll,  // dispatches
		topology.OutcomeSubject("*"), // the sweeper's lost outcomes
		topology.SubjectResultsAll, topology.SubjectDLQAll,
		"$KV."+topology.BucketSuperseded+".>",
		"$KV."+topology.BucketDispatcher+".>", // the seal key, created once
		"$KV."+topology.BucketRollouts+".>",   // rollouts' counts and transitions
		"$KV."+topology.BucketPipeline+".>",   // ensemble members' outputs
		// The dashboard gathers every replica's report (clusterview); it
		// may not cancel tasks, which is the admin's.
		protocol.SubjectAdminStats,
		topology.SubjectLoad, // the replicas' load changes, to each other (internal/loadshare)
	)
	// The dashboard shows the autoscaler's decisions: read only.
	p.Publish = append(p.Publish, streamAPI(kvAutoscale, "INFO", "get", "consume")...)
	// A tenant's tasks beyond its share of a band's pull window are parked
	// on subjects of their own (dispatcher/internal/intake/park.go).
	p.Publish = append(p.Publish, topology.ParkedFilters()...)
	p.Subscribe = []string{natsconn.InboxDispatcher + ".>", subjectAdminAll, // stats, cancel
		topology.SubjectReportsAll, // direct reports, answered through allow_responses
		topology.SubjectLoad}       // the other replicas' load changes
	return p
}

func producerPerms() Permissions {
	p := Permissions{}
	p.Publish = append(p.Publish, topology.SubjectTasksAll)
	p.Publish = append(p.Publish, streamAPI(topology.StreamTasks, "INFO")...)
	p.Publish = append(p.Publish, streamAPI(topology.StreamResults, "INFO", "get", "consume")...)
	p.Subscribe = []string{natsconn.InboxProducer + ".>"}
	return p
}

func adminPerms() Permissions {
	p := producerPerms()
	for _, s := range []string{topology.StreamDispatch, topology.StreamOutcomes, topology.StreamDLQ, kvSuperseded} {
		p.Publish = append(p.Publish, streamAPI(s, "INFO")...)
	}
	p.Publish = append(p.Publish, streamAPI(kvNodes, "INFO", "get", "consume")...)
	p.Publish = append(p.Publish, streamAPI(topology.StreamDLQ, "get", "consume", "MSG.DELETE")...)
	p.Publish = append(p.Publish, streamAPI(topology.StreamResults, "PURGE")...) // dlq replay clears the old result
	// mlsched rollout starts and steers rollouts
	p.Publish = append(p.Publish, streamAPI(kvRollouts, "INFO", "CREATE", "get", "consume")...)
	p.Publish = append(p.Publish, "$KV."+topology.BucketRollouts+".>")
	// mlsched autoscale publishes its decisions; top reads them
	// (creating a bucket reads the account's JetStream limits first)
	p.Publish = append(p.Publish, streamAPI(kvAutoscale, "INFO", "CREATE", "get", "consume")...)
	p.Publish = append(p.Publish, "$KV."+topology.BucketAutoscale+".>", "$JS.API.INFO")
	// ... and reads the task consumers' counts at every step (its backlog,
	// dispatcher/autoscaler/backlog.go; KEDA's lag with -policy keda): info only
	p.Publish = append(p.Publish, "$JS.API.CONSUMER.LIST."+topology.StreamTasks, "$JS.API.CONSUMER.INFO."+topology.StreamTasks+".*")
	p.Publish = append(p.Publish, subjectAdminAll) // stats, cancel
	p.Subscribe = []string{natsconn.InboxAdmin + ".>", natsconn.InboxProducer + ".>"}
	return p
}

func nodePerms(id string) Permissions {
	cons := topology.NodeConsumer(id)
	d := topology.StreamDispatch
	p := Permissions{}
	// Starting up checks that the streams exist (topology.Ensure).
	for _, s := range []string{topology.StreamTasks, d, topology.StreamOutcomes, topology.StreamResults, topology.StreamDLQ, kvNodes} {
		p.Publish = append(p.Publish, streamAPI(s, "INFO")...)
	}
	p.Publish = append(p.Publish,
		// Its own durable, bound to its own dispatch subject: the subject
		// names the filter, and the server checks the request against it.
		"$JS.API.CONSUMER.CREATE."+d+"."+cons+"."+topology.DispatchSubject(id),
		"$JS.API.CONSUMER.INFO."+d+"."+cons,
		"$JS.API.CONSUMER.MSG.NEXT."+d+"."+cons,
		"$JS.ACK."+d+"."+cons+".>",
		topology.OutcomeSubject(id),
		topology.ReportSubject(id), // its own direct reports
		"$KV."+topology.BucketNodes+"."+id,
	)
	p.Subscribe = []string{natsconn.InboxNode(id) + ".>"}
	return p
}

// Identities are the users of a deployment with the given nodes.
func Identities(nodes []string) []Identity {
	ids := []Identity{{Role: Dispatcher}, {Role: Producer}, {Role: Admin}}
	for _, n := range nodes {
		ids = append(ids, Identity{Role: Node, NodeID: n})
	}
	return ids
}

// User is an identity with its public key.
type User struct {
	Identity
	PublicKey string
}

// Render writes the auth.conf fragment for users.
func Render(users []User) ([]byte, error) {
	var b strings.Builder
	b.WriteString("# mlsched NATS authorization, written by `mlsched auth init`; see docs/security.md.\n")
	b.WriteString("# Include it from nats.conf with `include auth.conf`. It holds public keys only.\n")
	b.WriteString("authorization {\n  users = [\n")
	for _, u := range users {
		p, err := For(u.Identity)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "    # %s\n    {\n      nkey: %q\n      permissions: {\n", u.Name(), u.PublicKey)
		fmt.Fprintf(&b, "        publish: { allow: %s }\n", list(p.Publish))
		fmt.Fprintf(&b, "        subscribe: { allow: %s }\n", list(p.Subscribe))
		if p.AllowResponses {
			b.WriteString("        allow_responses: true\n")
		}
		b.WriteString("      }\n    }\n")
	}
	b.WriteString("  ]\n}\n")
	return []byte(b.String()), nil
}

func list(subjects []string) string {
	q := make([]string, len(subjects))
	for i, s := range subjects {
		q[i] = fmt.Sprintf("%q", s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// Result says what Init did.
type Result struct {
	Conf             string   // the auth.conf path
	Created, Rotated []string // secret files written
	Kept             []string // secret files that existed and were kept
	Users            []User
	// RedisACL is the redis-users.acl path (with Options.Redis).
	RedisACL string
	// SentinelACL is the sentinel-users.acl path (with Options.Redis).
	SentinelACL string
	// replaced are the public keys of rotated user seeds (revoked in
	// operator mode).
	replaced []string
}

// Options say what Write writes besides auth.conf and the seeds.
type Options struct {
	// Nodes are the worker node ids, one key each.
	Nodes []string
	// Rotate names the identities to give new secrets: roles, node-<id>,
	// or "redis" (a new Redis password).
	Rotate []string
	// SecretMode is the mode of the seed and password files (default
	// 0600). docker compose mounts a secret file as it is on the host into
	// containers that run as non-root users of their own, so a compose
	// deployment needs 0644; the directory stays 0700, so on the host only
	// its owner reaches them, and each container is given only its own.
	SecretMode os.FileMode
	// Redis also writes RedisPasswordFile (a random password, kept when
	// present) and RedisACLFile, a redis-server ACL file (--aclfile) in which
	// the user RedisUser, with that password's SHA-256, may use the
	// statistics keys only, and the default user may only PING (health
	// checks); the file also has the Sentinel deployment's users, and
	// SentinelACLFile is the sentinels' (see RedisSentinelUser).
	Redis bool
	// JWT writes the authorization in operator mode (decentralised JWT,
	// jwt.go): auth.conf holds the operator and account JWTs, every
	// identity gets a <name>.creds file, and the worker pool's scoped
	// signing key goes to worker-pool.nk, so replicas need no key made in
	// advance. Without it auth.conf lists nkey users.
	JWT bool
}

// Files Write writes with Options.Redis, and the dispatcher's Redis user.
const (
	RedisPasswordFile = "redis.password"
	RedisACLFile      = "redis-users.acl"
	RedisUser         = "mlsched"
	// The Sentinel deployment's users, in the same ACL file, with the same
	// password (one secret to mount and rotate; each user is limited to
	// what its component does, which keeps a mistake from doing more, not
	// a holder of the password): the replica authenticates to its master
	// as RedisReplicaUser (masteruser), sentinels to the data nodes and to
	// each other as RedisSentinelUser (sentinel auth-user, sentinel-user).
	RedisReplicaUser  = "mlsched-replica"
	RedisSentinelUser = "mlsched-sentinel"
	// SentinelACLFile is the sentinels' ACL file (redis-server --sentinel
	// --aclfile): RedisSentinelUser for peer sentinels, RedisUser may only
	// look the master up and follow failovers, the default user PING.
	SentinelACLFile = "sentinel-users.acl"
	// redisKeys are the keys the dispatcher's statistics use
	// (redisstats.DefaultPrefix).
	redisKeys = "mlsched:*"
	// rotateRedis names the Redis password in Options.Rotate.
	rotateRedis = "redis"
)

// Init writes dir/auth.conf and one seed file per identity (dir/<role>.nk,
// dir/node-<id>.nk). Existing seeds are kept, so re-running it with more
// nodes adds them; the names in rotate (roles, or node-<id>) get new keys.
// Seed files are written with mode 0600.
func Init(dir string, nodes []string, rotate []string) (Result, error) {
	return Write(dir, Options{Nodes: nodes, Rotate: rotate})
}

// Write is Init with Options: it also chmods kept secret files to
// SecretMode, and with Redis writes the Redis password and ACL files.
func Write(dir string, o Options) (Result, error) {
	nodes, rotate := o.Nodes, o.Rotate
	mode := o.SecretMode
	if mode == 0 {
		mode = 0o600
	}
	res := Result{Conf: filepath.Join(dir, ConfFile)}
	seen := map[string]bool{}
	for _, n := range nodes {
		if err := protocol.ValidToken(n, 64); err != nil {
			return res, fmt.Errorf("node id %q: %w", n, err)
		}
		if seen[n] {
			return res, fmt.Errorf("node id %q given twice", n)
		}
		seen[n] = true
	}
	ids := Identities(nodes)
	known := map[string]bool{}
	for _, id := range ids {
		known[id.Name()] = true
	}
	for _, r := range rotate {
		if !known[r] && (r != rotateRedis || !o.Redis) && (r != PoolRotate || !o.JWT) {
			return res, fmt.Errorf("cannot rotate %q: not one of %v", r, names(ids))
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, err
	}
	for _, id := range ids {
		path := id.SeedFile(dir)
		kp, err := readSeed(path)
		switch {
		case err == nil && !slices.Contains(rotate, id.Name()):
			if err := os.Chmod(path, mode); err != nil {
				return res, err
			}
			res.Kept = append(res.Kept, path)
		case err == nil || errors.Is(err, fs.ErrNotExist):
			existed := err == nil
			if existed {
				if old, err := kp.PublicKey(); err == nil {
					res.replaced = append(res.replaced, old)
				}
			}
			if kp, err = writeSeed(path, mode); err != nil {
				return res, err
			}
			if existed {
				res.Rotated = append(res.Rotated, path)
			} else {
				res.Created = append(res.Created, path)
			}
		default:
			return res, err
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return res, err
		}
		res.Users = append(res.Users, User{Identity: id, PublicKey: pub})
	}
	if o.JWT {
		if err := writeJWT(dir, mode, rotate, &res); err != nil {
			return res, err
		}
	} else {
		conf, err := Render(res.Users)
		if err != nil {
			return res, err
		}
		if err := writeAtomic(res.Conf, conf, 0o644); err != nil {
			return res, err
		}
	}
	if o.Redis {
		if err := writeRedis(dir, mode, slices.Contains(rotate, rotateRedis), &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// writeRedis writes the Redis password (kept unless rotate) and the ACL
// file that holds its SHA-256 only.
func writeRedis(dir string, mode os.FileMode, rotate bool, res *Result) error {
	path := filepath.Join(dir, RedisPasswordFile)
	b, err := os.ReadFile(path)
	pw := strings.TrimSpace(string(b))
	switch {
	case err == nil && pw != "" && !rotate:
		if err := os.Chmod(path, mode); err != nil {
			return err
		}
		res.Kept = append(res.Kept, path)
	case err == nil || errors.Is(err, fs.ErrNotExist):
		r := make([]byte, 24)
		if _, err := rand.Read(r); err != nil {
			return err
		}
		pw = hex.EncodeToString(r)
		if err := writeAtomic(path, []byte(pw+"\n"), mode); err != nil {
			return err
		}
		if err == nil && b != nil {
			res.Rotated = append(res.Rotated, path)
		} else {
			res.Created = append(res.Created, path)
		}
	default:
		return err
	}
	sum := sha256.Sum256([]byte(pw))
	h := hex.EncodeToString(sum[:])
	// Every command named exists from Redis 7.0 on: an unknown one stops
	// redis-server at start. The sentinel's are those Redis documents for
	// a Sentinel ACL user (docs: "Redis Sentinel", access control), its
	// channel the hello channel only.
	acl := fmt.Sprintf("user default on nopass -@all +ping\n"+
		"user %s on #%s ~%s +@all -@dangerous +info\n"+
		"user %s on #%s resetchannels -@all +psync +replconf +ping\n"+
		"user %s on #%s resetchannels &__sentinel__:hello -@all +multi +exec +slaveof +ping +info +role +subscribe +publish +config|rewrite +client|setname +client|kill +script|kill\n",
		RedisUser, h, redisKeys, RedisReplicaUser, h, RedisSentinelUser, h)
	res.RedisACL = filepath.Join(dir, RedisACLFile)
	if err := writeAtomic(res.RedisACL, []byte(acl), 0o644); err != nil {
		return err
	}
	// The sentinels: peers use every sentinel command; the dispatcher finds
	// the master and the other sentinels and listens for +switch-master
	// (go-redis's failover client), nothing else (no SENTINEL SET, FAILOVER,
	// REMOVE, MONITOR); anonymous clients only PING (health checks).
	sacl := fmt.Sprintf("user default on nopass -@all +ping\n"+
		"user %s on #%s allchannels +@all\n"+
		"user %s on #%s resetchannels &+switch-master -@all +ping +subscribe +sentinel|get-master-addr-by-name +sentinel|sentinels +sentinel|replicas +sentinel|slaves +client|setname\n",
		RedisSentinelUser, h, RedisUser, h)
	res.SentinelACL = filepath.Join(dir, SentinelACLFile)
	return writeAtomic(res.SentinelACL, []byte(sacl), 0o644)
}

func names(ids []Identity) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.Name()
	}
	return out
}

func readSeed(path string) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return nil, fmt.Errorf("%s: not an nkey seed: %w", path, err)
	}
	return kp, nil
}

func writeSeed(path string, mode os.FileMode) (nkeys.KeyPair, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	return kp, writeAtomic(path, append(seed, '\n'), mode)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
