package redisconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/mlsched/mlsched/shared/secret"
)

// ErrAuth is wrapped by Ping's error when Redis refuses the credentials (or
// their absence, or the ACL user lacks a permission): retrying will not fix
// it, so a process stops with a clear message instead of running degraded.
var ErrAuth = errors.New("authentication refused by Redis")

// ErrTLS is wrapped by Ping's error when the TLS handshake fails on a
// certificate: the server's is not trusted (MLSCHED_REDIS_CA), or the server
// refused the client's, or its absence (MLSCHED_REDIS_CERT/_KEY). Like
// ErrAuth, retrying will not fix it.
var ErrTLS = errors.New("TLS certificate refused")

// secure applies the password file and TLS files of cfg to o.
func (o *Options) secure(cfg Config) error {
	tlsURL := strings.HasPrefix(strings.TrimSpace(cfg.URL), "rediss")
	if (cfg.CA != "" || cfg.Cert != "") && !tlsURL {
		return errors.New("MLSCHED_REDIS_CA, _CERT and _KEY need a rediss:// URL")
	}
	if (cfg.Cert == "") != (cfg.Key == "") {
		return errors.New("MLSCHED_REDIS_CERT and MLSCHED_REDIS_KEY go together")
	}
	var pw string
	if cfg.PasswordFile != "" {
		var err error
		if pw, err = secret.ReadFile(cfg.PasswordFile); err != nil {
			return fmt.Errorf("MLSCHED_REDIS_PASSWORD_FILE: %w", err)
		}
	}
	var tc *tls.Config
	if tlsURL {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.CA != "" {
			pem, err := os.ReadFile(cfg.CA)
			if err != nil {
				return fmt.Errorf("MLSCHED_REDIS_CA: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return fmt.Errorf("MLSCHED_REDIS_CA: no certificate in %s", cfg.CA)
			}
			tc.RootCAs = pool
		}
		if cfg.Cert != "" {
			cert, err := tls.LoadX509KeyPair(cfg.Cert, cfg.Key)
			if err != nil {
				return fmt.Errorf("MLSCHED_REDIS_CERT/_KEY: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
	}
	switch o.Kind {
	case Sentinel:
		if pw != "" {
			o.Failover.Password = pw
			if o.Failover.SentinelPassword == "" {
				o.Failover.SentinelPassword = pw
			}
		}
		if tc != nil {
			tc.ServerName = serverName(o.Failover.TLSConfig)
			o.Failover.TLSConfig = tc
		}
	case Cluster:
		if pw != "" {
			o.Cluster.Password = pw
		}
		if tc != nil {
			tc.ServerName = serverName(o.Cluster.TLSConfig)
			o.Cluster.TLSConfig = tc
		}
	default:
		if pw != "" {
			o.Single.Password = pw
		}
		if tc != nil {
			tc.ServerName = serverName(o.Single.TLSConfig)
			o.Single.TLSConfig = tc
		}
	}
	return nil
}

func serverName(c *tls.Config) string {
	if c == nil {
		return ""
	}
	return c.ServerName
}

// Ping checks that Redis answers and accepts the credentials. Its error
// wraps ErrAuth when they are refused; any other error (Redis down) leaves
// the caller free to start degraded. Errors never carry a password.
func Ping(ctx context.Context, c redis.UniversalClient) error {
	err := c.Ping(ctx).Err()
	if err == nil {
		return nil
	}
	if IsAuthError(err) {
		return fmt.Errorf("%w: %v", ErrAuth, secret.Error(err))
	}
	if IsTLSRefusal(err) {
		return fmt.Errorf("%w: %v", ErrTLS, secret.Error(err))
	}
	return secret.Error(err)
}

// IsTLSRefusal reports whether err is a TLS handshake that failed on a
// certificate, on either side.
func IsTLSRefusal(err error) bool {
	if err == nil {
		return false
	}
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var alert tls.AlertError
	switch {
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &invalid):
		return true
	case errors.As(err, &alert):
		// bad_certificate, unsupported_certificate, certificate_revoked,
		// certificate_expired, certificate_unknown, unknown_ca,
		// access_denied, certificate_required
		switch alert {
		case 42, 43, 44, 45, 46, 48, 49, 116:
			return true
		}
	}
	s := err.Error() // errors that lost their type on the way
	for _, p := range []string{"tls: failed to verify certificate", "tls: certificate required", "tls: bad certificate",
		"tls: unknown certificate authority", "x509: "} {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

// IsAuthError reports whether err is Redis refusing authentication or an
// ACL permission.
func IsAuthError(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "invalid password", "invalid username-password",
		"ERR AUTH", "without any password configured"} {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}
