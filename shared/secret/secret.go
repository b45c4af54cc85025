// Package secret keeps credentials out of logs and error messages, and reads
// secret files (passwords, tokens) the way every mlsched process does.
//
// Credentials reach a process only through files (MLSCHED_*_FILE variables,
// seed and certificate files) or through the user-info part of a URL. The
// first never appear in a log line because their contents are never
// formatted; the second are stripped by URL and Text before a URL or an
// error that may quote one is logged or returned.
package secret

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
)

// Mask replaces credentials in redacted text.
const Mask = "REDACTED"

// userinfo matches "scheme://userinfo@" in free text. A userinfo has no '/',
// '@' or white space; the user part alone may be a token (nats://token@host),
// so the whole userinfo is masked, not only a password.
var userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s"']+@`)

// URL returns u with its user info (user, password or token) masked. A list
// of URLs separated by commas is redacted element by element. Text that does
// not parse as a URL is redacted as free text.
func URL(u string) string {
	if strings.Contains(u, ",") {
		parts := strings.Split(u, ",")
		for i, p := range parts {
			parts[i] = URL(p)
		}
		return strings.Join(parts, ",")
	}
	p, err := url.Parse(strings.TrimSpace(u))
	if err != nil || p.User == nil {
		return Text(u)
	}
	p.User = url.User(Mask)
	return p.String()
}

// Text masks the user info of every URL in s, e.g. an error message that
// quotes the URL it failed to dial.
func Text(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	return userinfo.ReplaceAllString(s, "${1}"+Mask+"@")
}

// Error returns err with every URL's user info masked in its message; the
// original stays reachable through errors.Is and errors.As.
func Error(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := Text(msg); red != msg {
		return &redacted{msg: red, err: err}
	}
	return err
}

type redacted struct {
	msg string
	err error
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

// ErrEmpty is returned by ReadFile for a file holding nothing but space.
var ErrEmpty = errors.New("secret file is empty")

// ReadFile reads a secret (password or token) from path, without its
// surrounding white space (a trailing newline is the usual way to write
// one). Errors name the file, never its contents.
func ReadFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read secret file: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s: %w", path, ErrEmpty)
	}
	return s, nil
}
