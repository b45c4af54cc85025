package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// NATSClusterOptions configure a nats-server cluster.
type NATSClusterOptions struct {
	// Nodes is the number of servers (default 3).
	Nodes int
	// SyncInterval replaces "always" in the JetStream block ("" keeps
	// always; "2m" is the server's default).
	SyncInterval string
	// Name is the cluster name and the prefix of the server names (default
	// "e2e").
	Name string
	// Direct connects servers and clients without the proxies (default
	// off), for benchmarks: no extra hop, but no Partition either.
	Direct bool
	// Auth, when set, is included in every server's configuration: clients
	// must present a key of its auth.conf (routes stay open, on loopback).
	Auth *Auth
}

// NATSCluster is a cluster of nats-server processes whose every link goes
// through a Proxy: a client port proxy per server and a proxy per route
// direction between two servers (the routes are a full mesh of configured
// routes). So a test can cut one server off from its peers and its clients
// (Partition) and heal it, on loopback, without root.
//
// Servers also learn each other's route address by gossip and dial it when
// a gossiped peer is not yet connected, or to reconnect a route that began
// that way. Such a route would bypass the per-link proxies: one proxy per
// server cannot be cut for one peer alone, so a partitioned server kept (or
// re-established) routes through its peers' advertised addresses and went on
// replicating. Each server therefore advertises a sink, a proxy that is cut
// for good and refuses every connection: every route that exists is a
// configured one, through the proxies that Partition cuts.
type NATSCluster struct {
	Name  string
	Nodes []*NATS
	// URL is the comma-separated list of the client URLs (through the
	// proxies), what MLSCHED_NATS_URL takes.
	URL string

	client []*Proxy          // per node: clients -> node
	sink   []*Proxy          // per node: the advertised route address, always cut
	links  map[[2]int]*Proxy // {from, to}: from's configured route to `to`

	mu          sync.Mutex
	partitioned map[int]bool
}

// natsNodeConfig is one server's part of a cluster configuration.
type natsNodeConfig struct {
	ServerName      string
	Port            int
	MonitorPort     int
	StoreDir        string
	SyncInterval    string // "" = always
	ClusterName     string
	ClusterPort     int
	ClientAdvertise string
	RouteAdvertise  string
	Routes          []string
}

// renderNATSNodeConfig renders a clustered server's configuration: the
// single-server settings of NATSConfig plus the cluster block.
func renderNATSNodeConfig(n natsNodeConfig) string {
	sync := n.SyncInterval
	if sync == "" {
		sync = "always"
	}
	routes := make([]string, len(n.Routes))
	for i, r := range n.Routes {
		routes[i] = fmt.Sprintf("    %q", "nats-route://"+r)
	}
	clientAdv, routeAdv := "", ""
	if n.ClientAdvertise != "" {
		clientAdv = fmt.Sprintf("# clients learn the proxied address, not the real one\nclient_advertise: %q\n", n.ClientAdvertise)
	}
	if n.RouteAdvertise != "" {
		routeAdv = fmt.Sprintf("  # peers that learn this server by gossip dial a sink that refuses:\n  # every route is a configured one, through the harness's proxies\n  advertise: %q\n", n.RouteAdvertise)
	}
	return fmt.Sprintf(`# written by the e2e harness: one server of a %[6]s cluster
server_name: %[1]q
listen: "127.0.0.1:%[2]d"
%[7]shttp: "127.0.0.1:%[3]d"
max_payload: 8MB
jetstream {
  store_dir: %[4]q
  sync_interval: %[5]s
  max_memory_store: 256MB
  max_file_store: 4GB
}
cluster {
  name: %[6]q
  listen: "127.0.0.1:%[8]d"
%[9]s  routes: [
%[10]s
  ]
}
`, n.ServerName, n.Port, n.MonitorPort, n.StoreDir, sync, n.ClusterName, clientAdv,
		n.ClusterPort, routeAdv, strings.Join(routes, "\n"))
}

// startNATSCluster starts o.Nodes servers with newProc making their
// processes, and waits until each is healthy (JetStream meta leader elected
// and the server current). On failure it kills what it started.
func startNATSCluster(o NATSClusterOptions, newProc func(name string) (*Process, error)) (*NATSCluster, error) {
	if o.Nodes <= 0 {
		o.Nodes = 3
	}
	if o.Name == "" {
		o.Name = "e2e"
	}
	bin, err := binary("nats-server")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for try := 0; try < 3; try++ { // a free port may be taken before we bind it
		nc, err := tryNATSCluster(o, bin, try, newProc)
		if err == nil {
			return nc, nil
		}
		lastErr = err
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, fmt.Errorf("start nats cluster: %w", lastErr)
}

func tryNATSCluster(o NATSClusterOptions, bin string, try int, newProc func(string) (*Process, error)) (_ *NATSCluster, err error) {
	nc := &NATSCluster{Name: o.Name, links: map[[2]int]*Proxy{}, partitioned: map[int]bool{}}
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	type ports struct{ client, cluster, monitor int }
	ps := make([]ports, o.Nodes)
	for i := range ps {
		var errs [3]error
		ps[i].client, errs[0] = FreePort()
		ps[i].cluster, errs[1] = FreePort()
		ps[i].monitor, errs[2] = FreePort()
		if err := errors.Join(errs[:]...); err != nil {
			return nil, err
		}
	}
	name := func(i int) string { return fmt.Sprintf("%s-n%d", o.Name, i+1) }
	for i, p := range ps {
		if o.Direct {
			break
		}
		cp, err := StartProxy(name(i)+" clients", fmt.Sprintf("127.0.0.1:%d", p.client))
		if err != nil {
			return nil, err
		}
		nc.client = append(nc.client, cp)
		sp, err := StartProxy(name(i)+" gossip sink", fmt.Sprintf("127.0.0.1:%d", p.cluster))
		if err != nil {
			return nil, err
		}
		sp.Cut() // before the servers start: nothing ever goes through
		nc.sink = append(nc.sink, sp)
	}
	for from := range ps {
		for to, p := range ps {
			if from == to || o.Direct {
				continue
			}
			lp, err := StartProxy(fmt.Sprintf("route %s->%s", name(from), name(to)), fmt.Sprintf("127.0.0.1:%d", p.cluster))
			if err != nil {
				return nil, err
			}
			nc.links[[2]int{from, to}] = lp
		}
	}
	var urls []string
	for i, p := range ps {
		var routes []string
		for to, pt := range ps {
			switch {
			case to == i:
			case o.Direct:
				routes = append(routes, fmt.Sprintf("127.0.0.1:%d", pt.cluster))
			default:
				routes = append(routes, nc.links[[2]int{i, to}].Addr())
			}
		}
		clientAddr, clientAdv, routeAdv := fmt.Sprintf("127.0.0.1:%d", p.client), "", ""
		if !o.Direct {
			clientAddr = nc.client[i].Addr()
			clientAdv, routeAdv = clientAddr, nc.sink[i].Addr()
		}
		procName := name(i)
		if try > 0 {
			procName = fmt.Sprintf("%s-try%d", procName, try)
		}
		proc, err := newProc(procName)
		if err != nil {
			return nil, err
		}
		n := &NATS{Process: proc, Port: p.client, MonitorPort: p.monitor, ServerName: name(i),
			URL:        "nats://" + clientAddr,
			MonitorURL: fmt.Sprintf("http://127.0.0.1:%d", p.monitor),
			StoreDir:   filepath.Join(proc.Dir, "jetstream"), ConfigPath: filepath.Join(proc.Dir, "nats.conf")}
		conf := renderNATSNodeConfig(natsNodeConfig{ServerName: name(i), Port: p.client, MonitorPort: p.monitor,
			StoreDir: n.StoreDir, SyncInterval: o.SyncInterval, ClusterName: o.Name, ClusterPort: p.cluster,
			ClientAdvertise: clientAdv, RouteAdvertise: routeAdv, Routes: routes})
		if o.Auth != nil {
			inc, err := o.Auth.include(proc.Dir)
			if err != nil {
				return nil, err
			}
			conf += inc
		}
		if err := os.WriteFile(n.ConfigPath, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		proc.Path, proc.Args = bin, []string{"-c", n.ConfigPath}
		nc.Nodes = append(nc.Nodes, n)
		urls = append(urls, n.URL)
	}
	nc.URL = strings.Join(urls, ",")
	// Start every server before waiting: a lone server has no JetStream
	// meta leader and is never healthy.
	for _, n := range nc.Nodes {
		if err := n.Process.Start(); err != nil {
			return nil, err
		}
	}
	for _, n := range nc.Nodes {
		if err := waitReady(n.Process, n.ready); err != nil {
			if strings.Contains(n.Logs(), "address already in use") {
				return nil, fmt.Errorf("%s: address already in use: %w", n.Name, err)
			}
			return nil, err
		}
	}
	return nc, nil
}

// Close kills every server and closes the proxies.
func (nc *NATSCluster) Close() {
	for _, n := range nc.Nodes {
		n.Kill()
	}
	for _, p := range nc.proxies() {
		p.Close()
	}
}

func (nc *NATSCluster) proxies() []*Proxy {
	out := append(append([]*Proxy(nil), nc.client...), nc.sink...)
	for _, p := range nc.links {
		out = append(out, p)
	}
	return out
}

// nodeProxies are the proxies that carry node i's traffic: its clients, the
// routes it dials and the routes dialled to it.
func (nc *NATSCluster) nodeProxies(i int) []*Proxy {
	out := []*Proxy{nc.client[i]}
	for k, p := range nc.links {
		if k[0] == i || k[1] == i {
			out = append(out, p)
		}
	}
	return out
}

// Partition cuts node i off from the other servers and from its clients:
// every connection to or from it is closed, in both directions, and new ones
// are refused until Heal. The server itself keeps running. Routes shows it:
// a partitioned server lists none.
func (nc *NATSCluster) Partition(i int) error {
	if len(nc.client) == 0 {
		return errors.New("a cluster started Direct has no proxies to cut")
	}
	nc.mu.Lock()
	nc.partitioned[i] = true
	nc.mu.Unlock()
	for _, p := range nc.nodeProxies(i) {
		p.Cut()
	}
	return nil
}

// Heal reconnects node i, keeping the links to other partitioned nodes cut.
func (nc *NATSCluster) Heal(i int) {
	if len(nc.client) == 0 {
		return
	}
	nc.mu.Lock()
	delete(nc.partitioned, i)
	cut := make(map[int]bool, len(nc.partitioned))
	for k := range nc.partitioned {
		cut[k] = true
	}
	nc.mu.Unlock()
	nc.client[i].Heal()
	for k, p := range nc.links {
		if (k[0] == i && !cut[k[1]]) || (k[1] == i && !cut[k[0]]) {
			p.Heal()
		}
	}
}

// Pause stops node i with SIGSTOP: its connections stay open but nothing
// answers, as with a long GC pause or a frozen VM.
func (nc *NATSCluster) Pause(i int) error { return nc.Nodes[i].Signal(syscall.SIGSTOP) }

// Resume continues node i after Pause.
func (nc *NATSCluster) Resume(i int) error { return nc.Nodes[i].Signal(syscall.SIGCONT) }

// Healthy reports nil when every running server answers /healthz with 200
// (JetStream enabled, a meta leader, its streams and consumers current).
func (nc *NATSCluster) Healthy(ctx context.Context) error {
	var errs []error
	for _, n := range nc.Nodes {
		if err := n.ready(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
		}
	}
	return errors.Join(errs...)
}

// WaitHealthy waits at most timeout until Healthy returns nil.
func (nc *NATSCluster) WaitHealthy(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return WaitFor(ctx, func() error { return nc.Healthy(ctx) })
}

// Route is one route connection of a server as its /routez reports it.
type Route struct {
	RemoteName   string `json:"remote_name"`
	DidSolicit   bool   `json:"did_solicit"`
	IsConfigured bool   `json:"is_configured"`
	IP           string `json:"ip"`
	Port         int    `json:"port"`
	Account      string `json:"account,omitempty"`
	// Via names the proxy a route the server dialled goes through (empty
	// for a route it accepted: the remote port is then the proxy's own
	// outgoing one).
	Via string `json:"-"`
}

func (r Route) String() string {
	dir := "accepted"
	if r.DidSolicit {
		dir = "dialled"
	}
	cfg := "implicit"
	if r.IsConfigured {
		cfg = "configured"
	}
	s := fmt.Sprintf("%s %s %s %s:%d", r.RemoteName, dir, cfg, r.IP, r.Port)
	if r.Account != "" {
		s += " account " + r.Account
	}
	if r.Via != "" {
		s += " via " + r.Via
	}
	return s
}

// Routes lists node i's route connections (its /routez), naming the proxy
// each dialled route goes through: what a test checks, or logs, to see
// whether a partition really cut a server off.
func (nc *NATSCluster) Routes(ctx context.Context, i int) ([]Route, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, nc.Nodes[i].MonitorURL+"/routez", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s routez: %s", nc.Nodes[i].ServerName, resp.Status)
	}
	var rz struct {
		Routes []Route `json:"routes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rz); err != nil {
		return nil, fmt.Errorf("%s routez: %w", nc.Nodes[i].ServerName, err)
	}
	byPort := map[int]string{}
	for _, p := range nc.proxies() {
		byPort[p.Port()] = p.Name
	}
	for k := range rz.Routes {
		if rz.Routes[k].DidSolicit {
			rz.Routes[k].Via = byPort[rz.Routes[k].Port]
		}
	}
	return rz.Routes, nil
}

// Isolated reports nil when node i lists no route and no other server lists
// a route to it, as after Partition(i) has taken effect; otherwise an error
// naming a route that crosses the cut and listing every server's routes.
func (nc *NATSCluster) Isolated(ctx context.Context, i int) error {
	cut := nc.Nodes[i].ServerName
	var crossing *Route
	var b strings.Builder
	for k, n := range nc.Nodes {
		rs, err := nc.Routes(ctx, k)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "\n%s:", n.ServerName)
		for j, r := range rs {
			fmt.Fprintf(&b, "\n  %s", r)
			if crossing == nil && (k == i || r.RemoteName == cut) {
				crossing = &rs[j]
			}
		}
	}
	if crossing != nil {
		return fmt.Errorf("a route crosses the partition of %s: %s; routes:%s", cut, crossing, b.String())
	}
	return nil
}

// WaitIsolated waits at most timeout until Isolated(i) returns nil: the
// servers notice closed routes at once, but a route may be in its handshake.
func (nc *NATSCluster) WaitIsolated(i int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return WaitFor(ctx, func() error { return nc.Isolated(ctx, i) })
}
