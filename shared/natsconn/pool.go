package natsconn

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// A pool key file (MLSCHED_NATS_POOL_KEY, written by `mlsched auth init
// -compose` as worker-pool.nk) holds a scoped signing key of the deployment's
// NATS account and that account's public key. A process given it makes its
// own user key at start and signs its own user JWT with the pool key; the
// server replaces that JWT's permissions with the signing key's template,
// bound to the user's public key ({{subject()}}). So every replica of a
// scaled service gets its own identity without a key made in advance, and
// can act only as itself: the node id is the user public key, which only
// the replica holding its seed can connect as. docs/security.md.
const poolAccountPrefix = "account:"

// FormatPoolKey is the pool key file's content.
func FormatPoolKey(account string, seed []byte) []byte {
	return fmt.Appendf(nil, "# mlsched worker pool: a scoped signing key of NATS account %s (docs/security.md)\n%s %s\n%s\n",
		account, poolAccountPrefix, account, seed)
}

// ParsePoolKey reads a pool key file's content: the account's public key
// and the signing key.
func ParsePoolKey(b []byte) (account string, signer nkeys.KeyPair, err error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, poolAccountPrefix):
			account = strings.TrimSpace(strings.TrimPrefix(line, poolAccountPrefix))
		default:
			if signer, err = nkeys.FromSeed([]byte(line)); err != nil {
				return "", nil, fmt.Errorf("not an nkey seed: %w", err)
			}
		}
	}
	switch {
	case !nkeys.IsValidPublicAccountKey(account):
		return "", nil, errors.New("no valid \"account: A...\" line")
	case signer == nil:
		return "", nil, errors.New("no signing key seed")
	}
	if pub, _ := signer.PublicKey(); !nkeys.IsValidPublicAccountKey(pub) {
		return "", nil, errors.New("the seed is not an account signing key")
	}
	return account, signer, nil
}

// poolUser is the user key a pool member made for itself.
type poolUser struct {
	once sync.Once
	kp   nkeys.KeyPair
	err  error
}

// PoolIdentity returns the public key of the user key this process uses
// with MLSCHED_NATS_POOL_KEY, making it on the first call; every copy of c
// made after that call shares it. It is the node id of a pooled worker.
func (c *Config) PoolIdentity() (string, error) {
	if c.PoolKey == "" {
		return "", errors.New("MLSCHED_NATS_POOL_KEY is not set")
	}
	if c.pool == nil {
		c.pool = &poolUser{}
	}
	c.pool.once.Do(func() { c.pool.kp, c.pool.err = nkeys.CreateUser() })
	if c.pool.err != nil {
		return "", c.pool.err
	}
	return c.pool.kp.PublicKey()
}

// poolOption signs this process's user JWT with the pool key (read now, so
// that a bad file fails at start) and authenticates with its user key.
func (c *Config) poolOption(name string) (nats.Option, error) {
	pub, err := c.PoolIdentity()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(c.PoolKey)
	if err != nil {
		return nil, fmt.Errorf("MLSCHED_NATS_POOL_KEY: %w", err)
	}
	account, signer, err := ParsePoolKey(b)
	if err != nil {
		return nil, fmt.Errorf("MLSCHED_NATS_POOL_KEY %s: %w", c.PoolKey, err)
	}
	uc := jwt.NewUserClaims(pub)
	uc.Name = name
	uc.IssuerAccount = account
	// A scoped signer's users state no permissions or limits: the server
	// applies the signing key's template.
	uc.UserPermissionLimits = jwt.UserPermissionLimits{}
	token, err := uc.Encode(signer)
	if err != nil {
		return nil, fmt.Errorf("MLSCHED_NATS_POOL_KEY: sign the user JWT: %w", err)
	}
	kp := c.pool.kp
	return nats.UserJWT(func() (string, error) { return token, nil }, func(nonce []byte) ([]byte, error) {
		return kp.Sign(nonce)
	}), nil
}
