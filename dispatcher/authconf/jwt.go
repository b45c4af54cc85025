package authconf

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/mlsched/mlsched/shared/natsconn"
)

// Decentralised JWT authorization (operator mode), for deployments whose
// workers are scaled replicas (docker compose --scale worker=N): nobody can
// make a key per replica in advance, so each replica makes its own user key
// and signs its own user JWT with the worker pool's scoped signing key. The
// server ignores the permissions that JWT states and applies the signing
// key's template instead, bound to the user's public key ({{subject()}}),
// which is also the replica's node id: a replica may only consume, ack,
// report and announce as itself, and it cannot connect as another replica
// without that replica's seed. The roles (dispatcher, producer, admin) and
// fixed named nodes get user JWTs signed by the account, with the same
// permissions as the nkey users of auth.conf. docs/security.md compares this
// with auth callout.

// Files WriteJWT writes in the directory, besides <role>.nk seeds.
const (
	OperatorSeedFile = "operator.nk"    // signs the account JWTs; never mounted
	AccountSeedFile  = "account.nk"     // the mlsched account; signs role users
	SystemSeedFile   = "sys-account.nk" // the system account
	// PoolKeyFile is the worker pool's scoped signing key (given to every
	// worker replica, MLSCHED_NATS_POOL_KEY).
	PoolKeyFile = "worker-pool.nk"
	// OperatorJWTFile keeps the operator JWT: nats-server cannot reload a
	// changed one, so it is written once and reused.
	OperatorJWTFile = "operator.jwt"
	// RevokedFile lists the public keys of rotated users, which the
	// account JWT revokes.
	RevokedFile = "revoked-users"
	// PoolRotate names the pool key in Options.Rotate.
	PoolRotate = "worker-pool"
	// PoolRole is the scoped signing key's role in the account JWT.
	PoolRole = "worker-pool"
	// poolSubject is the template the server fills with the user's key.
	poolSubject = "{{subject()}}"
)

// CredsFile is where WriteJWT writes the identity's credentials (user JWT
// and seed) in dir.
func (i Identity) CredsFile(dir string) string { return filepath.Join(dir, i.Name()+".creds") }

// PoolPermissions are the worker pool's template: a node's permissions
// with its id bound to the connecting user's public key.
func PoolPermissions() Permissions { return nodePerms(poolSubject) }

// writeJWT makes (or keeps) the operator, account, system account and pool
// keys, and writes the creds of every user of res and auth.conf in operator
// mode (the JWTs preloaded in a memory resolver).
func writeJWT(dir string, mode os.FileMode, rotate []string, res *Result) error {
	opKP, err := keyFile(filepath.Join(dir, OperatorSeedFile), nkeys.CreateOperator, 0o600, false, res)
	if err != nil {
		return err
	}
	accKP, err := keyFile(filepath.Join(dir, AccountSeedFile), nkeys.CreateAccount, 0o600, false, res)
	if err != nil {
		return err
	}
	sysKP, err := keyFile(filepath.Join(dir, SystemSeedFile), nkeys.CreateAccount, 0o600, false, res)
	if err != nil {
		return err
	}
	accPub, _ := accKP.PublicKey()
	poolPath := filepath.Join(dir, PoolKeyFile)
	poolKP, err := poolKey(poolPath, accPub, mode, slices.Contains(rotate, PoolRotate), res)
	if err != nil {
		return err
	}
	opPub, _ := opKP.PublicKey()
	sysPub, _ := sysKP.PublicKey()
	opJWT, err := operatorJWT(filepath.Join(dir, OperatorJWTFile), opKP, opPub, sysPub)
	if err != nil {
		return err
	}
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	sysJWT, err := sc.Encode(opKP)
	if err != nil {
		return fmt.Errorf("system account JWT: %w", err)
	}
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = "mlsched"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit,
		Streams: jwt.NoLimit, Consumer: jwt.NoLimit, MaxAckPending: jwt.NoLimit}
	poolPub, _ := poolKP.PublicKey()
	scope := jwt.NewUserScope()
	scope.Key = poolPub
	scope.Role = PoolRole
	scope.Description = "mlsched worker replicas: each signs its own user; node id = user public key"
	scope.Template = userLimits(PoolPermissions())
	ac.SigningKeys.AddScopedSigner(scope)
	// Users of rotated keys are revoked (their creds would stay valid
	// otherwise: a user JWT signed by the account needs no server entry).
	revoked, err := revocations(filepath.Join(dir, RevokedFile), res.replaced)
	if err != nil {
		return err
	}
	for _, pub := range revoked {
		ac.RevokeAt(pub, time.Now().Add(time.Second))
	}
	accJWT, err := ac.Encode(opKP)
	if err != nil {
		return fmt.Errorf("account JWT: %w", err)
	}
	for _, u := range res.Users {
		seed, err := os.ReadFile(u.SeedFile(dir))
		if err != nil {
			return err
		}
		p, err := For(u.Identity)
		if err != nil {
			return err
		}
		uc := jwt.NewUserClaims(u.PublicKey)
		uc.Name = u.Name()
		uc.UserPermissionLimits = userLimits(p)
		token, err := uc.Encode(accKP)
		if err != nil {
			return fmt.Errorf("%s user JWT: %w", u.Name(), err)
		}
		creds, err := jwt.FormatUserConfig(token, []byte(strings.TrimSpace(string(seed))))
		if err != nil {
			return err
		}
		if err := writeAtomic(u.CredsFile(dir), creds, mode); err != nil {
			return err
		}
	}
	var b strings.Builder
	b.WriteString("# mlsched NATS authorization in operator mode (decentralised JWT), written by\n")
	b.WriteString("# `mlsched auth init -compose`; see docs/security.md. Public JWTs only.\n")
	// The role users' JWTs list their permissions, and a client sends its
	// JWT in the CONNECT line: the default 4 KiB limit is too small.
	b.WriteString("max_control_line: 64KB\n")
	fmt.Fprintf(&b, "operator: %q\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n", opJWT, sysPub)
	fmt.Fprintf(&b, "  # SYS\n  %s: %q\n  # mlsched\n  %s: %q\n}\n", sysPub, sysJWT, accPub, accJWT)
	return writeAtomic(res.Conf, []byte(b.String()), 0o644)
}

// userLimits are p as JWT user permissions, with no other limit.
func userLimits(p Permissions) jwt.UserPermissionLimits {
	l := jwt.UserPermissionLimits{}
	l.Limits = jwt.Limits{NatsLimits: jwt.NatsLimits{Subs: jwt.NoLimit, Data: jwt.NoLimit, Payload: jwt.NoLimit}}
	l.Pub.Allow.Add(p.Publish...)
	l.Sub.Allow.Add(p.Subscribe...)
	if p.AllowResponses {
		l.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: 2 * time.Minute}
	}
	return l
}

// keyFile reads the seed at path, or makes one with create.
func keyFile(path string, create func() (nkeys.KeyPair, error), mode os.FileMode, rotate bool, res *Result) (nkeys.KeyPair, error) {
	kp, err := readSeed(path)
	switch {
	case err == nil && !rotate:
		res.Kept = append(res.Kept, path)
		return kp, os.Chmod(path, mode)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	existed := err == nil
	if kp, err = create(); err != nil {
		return nil, err
	}
	seed, _ := kp.Seed()
	if err := writeAtomic(path, append(seed, '\n'), mode); err != nil {
		return nil, err
	}
	if existed {
		res.Rotated = append(res.Rotated, path)
	} else {
		res.Created = append(res.Created, path)
	}
	return kp, nil
}

// poolKey reads the pool key file, or makes a new signing key.
func poolKey(path, account string, mode os.FileMode, rotate bool, res *Result) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(path)
	if err == nil && !rotate {
		acc, kp, perr := natsconn.ParsePoolKey(b)
		if perr == nil && acc == account {
			res.Kept = append(res.Kept, path)
			return kp, os.Chmod(path, mode)
		}
		if perr != nil {
			return nil, fmt.Errorf("%s: %w", path, perr)
		}
		// another account's (account.nk was replaced): a new key
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	kp, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	seed, _ := kp.Seed()
	if err := writeAtomic(path, natsconn.FormatPoolKey(account, seed), mode); err != nil {
		return nil, err
	}
	if b != nil {
		res.Rotated = append(res.Rotated, path)
	} else {
		res.Created = append(res.Created, path)
	}
	return kp, nil
}

// revocations adds keys to the list at path and returns the whole list.
func revocations(path string, keys []string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	list := strings.Fields(string(b))
	for _, k := range keys {
		if !slices.Contains(list, k) {
			list = append(list, k)
		}
	}
	if len(keys) > 0 {
		if err := writeAtomic(path, []byte(strings.Join(list, "\n")+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	return list, nil
}

// operatorJWT returns the operator JWT kept at path when it is the
// operator's with that system account, or encodes and keeps a new one.
func operatorJWT(path string, opKP nkeys.KeyPair, opPub, sysPub string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		token := strings.TrimSpace(string(b))
		if oc, err := jwt.DecodeOperatorClaims(token); err == nil && oc.Subject == opPub && oc.SystemAccount == sysPub {
			return token, nil
		}
	}
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "mlsched"
	oc.SystemAccount = sysPub
	token, err := oc.Encode(opKP)
	if err != nil {
		return "", fmt.Errorf("operator JWT: %w", err)
	}
	return token, writeAtomic(path, []byte(token+"\n"), 0o644)
}
