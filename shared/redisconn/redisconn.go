// Package redisconn builds the one Redis client every mlsched process uses
// from MLSCHED_REDIS_URL, so that a single server, a Sentinel-managed
// master and a Redis Cluster are all one setting away, and so that
// credentials, TLS and start-up checks are added in one place.
//
// Accepted URLs (user and password are optional everywhere):
//
//	redis://[user:pass@]host:port[/db][?opts]        one server
//	rediss://...                                      one server over TLS
//	redis+sentinel://[user:pass@]h1:p1,h2:p2,h3:p3/master[/db][?opts]
//	                                                  Sentinel: the sentinels'
//	                                                  addresses and the master's name
//	rediss+sentinel://...                             Sentinel, TLS to the data nodes
//	redis+cluster://[user:pass@]h1:p1,h2:p2[?opts]   Redis Cluster (seed nodes)
//	rediss+cluster://...                              Redis Cluster over TLS
//
// opts are go-redis's own query options (dial_timeout=2s, max_retries=3,
// pool_size=20, ...; see redis.ParseURL); an unknown one is an error. With
// Sentinel the URL's user and password authenticate to the data nodes and
// to the sentinels alike; sentinel_password=... (a query option) sets a
// different one for the sentinels.
//
// Every client is a redis.UniversalClient; the statistics store keeps all
// its keys in one hash slot, so its scripts run on Redis Cluster too.
package redisconn

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Kind is the topology a URL names.
type Kind string

const (
	// Single is one redis-server (redis://, rediss://).
	Single Kind = "single"
	// Sentinel is a master found through Redis Sentinel.
	Sentinel Kind = "sentinel"
	// Cluster is a Redis Cluster.
	Cluster Kind = "cluster"
)

// ErrInvalidURL is wrapped by every error about the URL itself.
var ErrInvalidURL = errors.New("invalid Redis URL")

// Config is how to reach Redis.
type Config struct {
	// URL in one of the forms of the package documentation (required).
	URL string
	// ClientName is shown by CLIENT LIST (default empty: none).
	ClientName string
	// PasswordFile holds the password (of the URL's user, an ACL user, or
	// of the default user), instead of the URL (default empty).
	PasswordFile string
	// CA verifies the server of a rediss:// URL (default: the system pool);
	// Cert and Key are the client's certificate, for servers that require
	// one (default empty).
	CA, Cert, Key string
}

// Options are parsed connection options, one of the three set according
// to Kind. Callers may adjust them (credentials, TLS) before NewClient.
type Options struct {
	Kind     Kind
	Single   *redis.Options
	Failover *redis.FailoverOptions
	Cluster  *redis.ClusterOptions
}

// Open parses cfg and returns a client; it does not contact Redis (go-redis
// connects lazily, and a dispatcher starts, degraded, while Redis is down).
func Open(cfg Config) (redis.UniversalClient, error) {
	o, err := Parse(cfg)
	if err != nil {
		return nil, err
	}
	if err := o.secure(cfg); err != nil {
		return nil, err
	}
	return o.NewClient(), nil
}

// Parse turns cfg into Options.
func Parse(cfg Config) (*Options, error) {
	raw := strings.TrimSpace(cfg.URL)
	if raw == "" {
		return nil, fmt.Errorf("%w: empty", ErrInvalidURL)
	}
	bad := func(why string, args ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidURL, Redact(raw), fmt.Sprintf(why, args...))
	}
	// net/url takes one host: parse with the first, split the list apart.
	first, hosts := firstHost(raw)
	u, err := url.Parse(first)
	if err != nil {
		return nil, bad("%v", redactErr(err, first))
	}
	base, kind, ok := strings.Cut(u.Scheme, "+")
	if base != "redis" && base != "rediss" {
		return nil, bad("scheme must be redis, rediss, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster")
	}
	o := &Options{}
	switch {
	case !ok:
		if strings.Contains(hosts, ",") {
			return nil, bad("several hosts: use redis+sentinel:// or redis+cluster://")
		}
		o.Kind = Single
		if o.Single, err = redis.ParseURL(raw); err != nil {
			return nil, bad("%v", err)
		}
		o.Single.ClientName = cfg.ClientName
		return o, nil
	case kind == "sentinel":
		o.Kind = Sentinel
	case kind == "cluster":
		o.Kind = Cluster
	default:
		return nil, bad("unknown topology %q (want sentinel or cluster)", kind)
	}
	addrs, err := splitHosts(hosts)
	if err != nil {
		return nil, bad("%v", err)
	}
	// Rewrite as go-redis's own form: the first address as host, the others
	// as addr= parameters.
	q := u.Query()
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	path := strings.Trim(u.Path, "/")
	if o.Kind == Sentinel {
		master, db, _ := strings.Cut(path, "/")
		if master == "" {
			return nil, bad("the path must name the master: redis+sentinel://host:port,.../<master>[/db]")
		}
		q.Set("master_name", master)
		path = db
	} else if path != "" {
		return nil, bad("a cluster URL has no database path (Redis Cluster has only db 0)")
	}
	sentinelPass := q.Get("sentinel_password")
	q.Del("sentinel_password")
	if sentinelPass != "" && o.Kind != Sentinel {
		return nil, bad("sentinel_password applies to redis+sentinel URLs only")
	}
	n := url.URL{Scheme: base, User: u.User, Host: addrs[0], Path: "/" + path, RawQuery: q.Encode()}
	switch o.Kind {
	case Sentinel:
		if o.Failover, err = redis.ParseFailoverURL(n.String()); err != nil {
			return nil, bad("%v", err)
		}
		f := o.Failover
		// ParseFailoverURL reads the URL's credentials as the sentinels';
		// ours name the data nodes' (and the sentinels' unless overridden).
		f.Username, f.Password = f.SentinelUsername, f.SentinelPassword
		if sentinelPass != "" {
			f.SentinelPassword = sentinelPass
		}
		f.ClientName = cfg.ClientName
	case Cluster:
		if o.Cluster, err = redis.ParseClusterURL(n.String()); err != nil {
			return nil, bad("%v", err)
		}
		o.Cluster.ClientName = cfg.ClientName
	}
	return o, nil
}

// firstHost returns raw with its host list cut to the first host, and the
// whole list.
func firstHost(raw string) (string, string) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw, ""
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	auth, tail := rest[:end], rest[end:]
	user, hosts := "", auth
	if i := strings.LastIndexByte(auth, '@'); i >= 0 {
		user, hosts = auth[:i+1], auth[i+1:]
	}
	head, _, _ := strings.Cut(hosts, ",")
	return scheme + "://" + user + head + tail, hosts
}

// splitHosts splits "h1:p1,h2:p2". Every address must name its port:
// sentinels and cluster nodes seldom listen on Redis's default.
func splitHosts(hosts string) ([]string, error) {
	if hosts == "" {
		return nil, errors.New("no addresses")
	}
	var out []string
	for _, h := range strings.Split(hosts, ",") {
		host, port, err := net.SplitHostPort(h)
		if err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("address %q must be host:port", h)
		}
		out = append(out, net.JoinHostPort(host, port))
	}
	return out, nil
}

// NewClient builds the client the options describe.
func (o *Options) NewClient() redis.UniversalClient {
	switch o.Kind {
	case Sentinel:
		return redis.NewFailoverClient(o.Failover)
	case Cluster:
		return newClusterClient(o.Cluster)
	default:
		return redis.NewClient(o.Single)
	}
}

// Addrs are the addresses the client starts from: the server, the
// sentinels or the cluster's seed nodes.
func (o *Options) Addrs() []string {
	switch o.Kind {
	case Sentinel:
		return o.Failover.SentinelAddrs
	case Cluster:
		return o.Cluster.Addrs
	default:
		return []string{o.Single.Addr}
	}
}

// Redact returns the URL with its password replaced by "xxxxx", for logs
// and error messages. Text that does not parse is reduced to its scheme.
func Redact(raw string) string {
	first, hosts := firstHost(raw)
	u, err := url.Parse(first)
	if err != nil {
		scheme, _, _ := strings.Cut(raw, "://")
		return scheme + "://(unparsable)"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	q := u.Query()
	for _, k := range []string{"password", "sentinel_password"} {
		if q.Has(k) {
			q.Set(k, "xxxxx")
		}
	}
	u.RawQuery = q.Encode()
	u.Host = hosts
	return u.String()
}

// redactErr keeps url.Parse errors from echoing the raw URL, password
// included.
func redactErr(err error, raw string) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return errors.New(strings.ReplaceAll(err.Error(), raw, Redact(raw)))
}
