// Package natsconn is the one way every mlsched process and the producer SDK
// reach NATS: server list, credentials, TLS and inbox prefix from MLSCHED_NATS_*
// variables, logging that never shows a credential, and errors whose URLs are
// redacted.
//
// Embed Config in a process configuration as a field named NATS:
//
//	type Config struct {
//		NATS natsconn.Config
//	}
//
// and envconfig reads MLSCHED_NATS_URL, MLSCHED_NATS_NKEY, and so on.
package natsconn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/secret"
)

// DefaultURL is the server a process dials when MLSCHED_NATS_URL is unset.
const DefaultURL = "nats://127.0.0.1:4222"

// Config says how to reach NATS. At most one of NKey, Creds, User (with
// PasswordFile) and TokenFile may be set; credentials embedded in URL also
// work but are discouraged (they end up in process listings). Field names
// are the variables' (no envconfig tag: a tag would make envconfig fall back
// to the bare name, e.g. $USER).
type Config struct {
	// URL is the server, or several separated by commas, for a cluster
	// (default nats://127.0.0.1:4222). tls:// forces TLS.
	URL string `default:"nats://127.0.0.1:4222" desc:"NATS server URL, or several separated by commas"`
	// Nkey is an nkey seed file, as written by `mlsched auth init`
	// (default empty).
	Nkey string `desc:"nkey seed file (mlsched auth init writes one per role)"`
	// Creds is a JWT credentials file, for operator-mode deployments
	// (default empty).
	Creds string `desc:"JWT user credentials file (operator mode)"`
	// PoolKey is a worker pool's signing key file (operator mode, as
	// `mlsched auth init -compose` writes it): the process makes its own
	// user key and signs its own user JWT with it, and a worker takes that
	// key's public key as its node id (default empty). See pool.go.
	PoolKey string `split_words:"true" desc:"worker pool signing key file: each replica makes and signs its own identity (operator mode)"`
	// pool is the user key made for PoolKey, shared by copies of Config.
	pool *poolUser
	// User names the user whose password is in PasswordFile (default empty).
	User string `desc:"user name, with MLSCHED_NATS_PASSWORD_FILE"`
	// PasswordFile holds User's password (default empty). It is read at
	// every (re)connection, so a rotated password needs no restart.
	PasswordFile string `split_words:"true" desc:"file holding the password of MLSCHED_NATS_USER"`
	// TokenFile holds an authentication token (default empty), read at
	// every (re)connection.
	TokenFile string `split_words:"true" desc:"file holding an authentication token"`
	// CA is a PEM file of the certificate authorities that sign the
	// server's certificate; setting it turns TLS on (default empty: the
	// system pool, when TLS is on).
	CA string `desc:"PEM CA file to verify the server (turns TLS on)"`
	// Cert and Key are the client's PEM certificate and key, for servers
	// that verify clients (mTLS) (default empty).
	Cert string `desc:"PEM client certificate (mTLS), with MLSCHED_NATS_KEY"`
	Key  string `desc:"PEM client key (mTLS)"`
	// InboxPrefix replaces _INBOX in reply subjects. With `mlsched auth init`
	// permissions each role may only receive replies under its own prefix
	// (default empty: the role's, see docs/security.md).
	InboxPrefix string `split_words:"true" desc:"reply subject prefix (default: the process role's, see docs/security.md)"`
}

// Inbox prefixes of the roles `mlsched auth init` writes permissions for;
// each process uses its role's unless MLSCHED_NATS_INBOX_PREFIX says
// otherwise.
const (
	InboxDispatcher = "_INBOX.dispatcher"
	InboxProducer   = "_INBOX.producer"
	InboxAdmin      = "_INBOX.admin"
	inboxNodes      = "_INBOX.node"
)

// InboxNode is the inbox prefix of node id.
func InboxNode(id string) string { return inboxNodes + "." + id }

// Servers returns the server URLs of the comma-separated list (default
// DefaultURL).
func (c Config) Servers() []string {
	var out []string
	for _, s := range strings.Split(c.URL, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		out = []string{DefaultURL}
	}
	return out
}

// EnvPrefix is the prefix of the variables Config is read from.
const EnvPrefix = "MLSCHED_NATS"

// WithEnv returns c with every field left empty taken from its MLSCHED_NATS_*
// variable (MLSCHED_NATS_URL, MLSCHED_NATS_NKEY, ...), so that a program
// building a Config in code, e.g. client.Dial(natsconn.Config{}), honours
// the same environment as the binaries; a field set in code wins.
func (c Config) WithEnv() (Config, error) {
	var env Config
	if err := envconfig.Process(EnvPrefix, &env); err != nil {
		return c, fmt.Errorf("%s_*: %w", EnvPrefix, err)
	}
	if c.URL == "" && env.URL == DefaultURL {
		env.URL = "" // the default tag, not the environment: leave Servers its default
	}
	v, e := reflect.ValueOf(&c).Elem(), reflect.ValueOf(env)
	for i := 0; i < v.NumField(); i++ {
		if f := v.Field(i); f.Kind() == reflect.String && f.String() == "" {
			f.SetString(e.Field(i).String())
		}
	}
	return c, nil
}

// Redacted returns the server list with credentials masked, for logs.
func (c Config) Redacted() string { return secret.URL(strings.Join(c.Servers(), ",")) }

// Validate reports a configuration that cannot work, naming the variable.
func (c Config) Validate() error {
	var set []string
	for name, v := range map[string]string{
		"MLSCHED_NATS_NKEY": c.Nkey, "MLSCHED_NATS_CREDS": c.Creds, "MLSCHED_NATS_POOL_KEY": c.PoolKey,
		"MLSCHED_NATS_USER": c.User, "MLSCHED_NATS_TOKEN_FILE": c.TokenFile,
	} {
		if v != "" {
			set = append(set, name)
		}
	}
	switch {
	case len(set) > 1:
		return fmt.Errorf("NATS credentials: set only one of MLSCHED_NATS_NKEY, _CREDS, _POOL_KEY, _USER, _TOKEN_FILE (got %s)", strings.Join(slices.Sorted(slices.Values(set)), ", "))
	case c.PasswordFile != "" && c.User == "":
		return errors.New("MLSCHED_NATS_PASSWORD_FILE is set without MLSCHED_NATS_USER")
	case c.User != "" && c.PasswordFile == "":
		return errors.New("MLSCHED_NATS_USER is set without MLSCHED_NATS_PASSWORD_FILE")
	case (c.Cert == "") != (c.Key == ""):
		return errors.New("MLSCHED_NATS_CERT and MLSCHED_NATS_KEY go together")
	case c.InboxPrefix != "" && (strings.ContainsAny(c.InboxPrefix, "*> \t") || strings.HasSuffix(c.InboxPrefix, ".")):
		return fmt.Errorf("invalid MLSCHED_NATS_INBOX_PREFIX=%q: no wildcards, spaces or trailing dot", c.InboxPrefix)
	}
	for _, u := range c.Servers() {
		scheme, _, found := strings.Cut(u, "://")
		if !found {
			continue // host:port
		}
		switch strings.ToLower(scheme) {
		case "nats", "tls", "ws", "wss":
		case "http", "https":
			// nats.go would dial it and report only EOF.
			return fmt.Errorf("invalid MLSCHED_NATS_URL=%q: %s:// is not a NATS URL; use nats://host:4222 (the client port; 8222 is the monitoring port)",
				secret.URL(u), scheme)
		default:
			return fmt.Errorf("invalid MLSCHED_NATS_URL=%q: unknown scheme %s://; use nats:// or tls://", secret.URL(u), scheme)
		}
	}
	return nil
}

// Options returns the nats.go options for the credentials, TLS and inbox
// prefix of c; defaultInbox is used when c sets no prefix ("" keeps _INBOX).
// Secret files are read when the connection authenticates, never logged.
func (c Config) Options(defaultInbox string) ([]nats.Option, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	switch {
	case c.Nkey != "":
		o, err := nats.NkeyOptionFromSeed(c.Nkey)
		if err != nil {
			return nil, fmt.Errorf("MLSCHED_NATS_NKEY: %w", err)
		}
		opts = append(opts, o)
	case c.Creds != "":
		opts = append(opts, nats.UserCredentials(c.Creds))
	case c.PoolKey != "":
		host, _ := os.Hostname()
		o, err := c.poolOption(host)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
	case c.User != "":
		user, file := c.User, c.PasswordFile
		if _, err := secret.ReadFile(file); err != nil {
			return nil, fmt.Errorf("MLSCHED_NATS_PASSWORD_FILE: %w", err)
		}
		opts = append(opts, nats.UserInfoHandler(func() (string, string) {
			pw, err := secret.ReadFile(file)
			if err != nil {
				return user, "" // refused by the server, reported as an authorization error
			}
			return user, pw
		}))
	case c.TokenFile != "":
		file := c.TokenFile
		if _, err := secret.ReadFile(file); err != nil {
			return nil, fmt.Errorf("MLSCHED_NATS_TOKEN_FILE: %w", err)
		}
		opts = append(opts, nats.TokenHandler(func() string {
			t, _ := secret.ReadFile(file)
			return t
		}))
	}
	if c.CA != "" {
		opts = append(opts, nats.RootCAs(c.CA))
	}
	if c.Cert != "" {
		opts = append(opts, nats.ClientCert(c.Cert, c.Key))
	}
	if p := c.InboxPrefix; p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	} else if defaultInbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(defaultInbox))
	}
	return opts, nil
}

// Conn describes the connection Connect makes.
type Conn struct {
	// Name is the connection name the server shows (e.g. mlsched-worker-n1).
	Name string
	// Inbox is the role's inbox prefix, used when Config sets none.
	Inbox string
	// Log receives disconnections, reconnections and asynchronous errors
	// (permission violations, slow consumers), with URLs redacted (default:
	// nothing is logged).
	Log *zerolog.Logger
	// Retry reconnects forever (long-running processes); otherwise the
	// nats.go defaults apply (a CLI).
	Retry bool
	// Timeout of the first connection (default the nats.go default, 2s).
	Timeout time.Duration
}

// Connect dials the servers of c. Extra options come last and may override
// any default. The error names the servers with credentials masked.
func Connect(c Config, how Conn, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := c.Options(how.Inbox)
	if err != nil {
		return nil, err
	}
	if how.Name != "" {
		opts = append(opts, nats.Name(how.Name))
	}
	if how.Retry {
		opts = append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	}
	if how.Timeout > 0 {
		opts = append(opts, nats.Timeout(how.Timeout))
	}
	if log := how.Log; log != nil {
		opts = append(opts,
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil {
					log.Warn().Err(secret.Error(err)).Msg("disconnected from NATS")
				}
			}),
			nats.ReconnectHandler(func(nc *nats.Conn) {
				log.Info().Str("url", secret.URL(nc.ConnectedUrl())).Msg("reconnected to NATS")
			}),
			nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
				ev := log.Warn().Err(secret.Error(err))
				if sub != nil {
					ev = ev.Str("subject", sub.Subject)
				}
				ev.Msg("NATS error")
			}))
	}
	opts = append(opts, extra...)
	nc, err := nats.Connect(strings.Join(c.Servers(), ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", c.Redacted(), secret.Error(err))
	}
	return nc, nil
}

// startRetry is how often ConnectContext tries again while no server
// answers at start.
const startRetry = time.Second

// ConnectContext is Connect for a long-running process (how.Retry): when no
// server answers at start it keeps trying, every second, until ctx ends,
// logging a warning on how.Log (the first failure, then every tenth), as it
// reconnects for ever once connected; processes may start before NATS
// (compose, systemd). A refused credential or a bad configuration is not
// retried. Without how.Retry it is Connect.
func ConnectContext(ctx context.Context, c Config, how Conn, extra ...nats.Option) (*nats.Conn, error) {
	for attempt := 1; ; attempt++ {
		nc, err := Connect(c, how, extra...)
		if err == nil || !how.Retry || IsAuthError(err) || !errors.Is(err, nats.ErrNoServers) {
			return nc, err
		}
		if how.Log != nil && attempt%10 == 1 {
			how.Log.Warn().Err(err).Int("attempt", attempt).Dur("retry_every", startRetry).
				Msg("NATS does not answer at start: retrying until it does")
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (gave up: %w)", err, context.Cause(ctx))
		case <-time.After(startRetry):
		}
	}
}

// IsAuthError reports whether err is the server refusing the credentials
// (or their absence), which retrying will not fix.
func IsAuthError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)
}
