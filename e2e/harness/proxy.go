package harness

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy is a TCP proxy on loopback that a test can cut and heal, to
// partition one server from its peers and clients without touching the
// machine's network: Cut closes every connection through it and refuses new
// ones until Heal. The peers see the connection reset, as after a crash or a
// firewall that rejects, and reconnect elsewhere.
type Proxy struct {
	// Name labels the proxy in errors ("n1-client", "route n2->n1").
	Name string
	// Target is the host:port every connection is forwarded to.
	Target string

	ln net.Listener

	mu      sync.Mutex
	cut     bool
	closed  bool
	refused int
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// StartProxy listens on a free loopback port and forwards to target.
func StartProxy(name, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy %s: %w", name, err)
	}
	p := &Proxy{Name: name, Target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Cut closes every connection through the proxy and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

// Heal lets connections through again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// IsCut reports whether the proxy refuses connections.
func (p *Proxy) IsCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

// Refused is the number of connections refused because the proxy was cut.
func (p *Proxy) Refused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// Conns is the number of open connection halves (two per forwarded
// connection).
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops listening, closes every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// track registers both halves of a connection; it refuses (false) while the
// proxy is cut or closed.
func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || p.closed {
		if p.cut && !p.closed {
			p.refused++
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	if !p.track() { // cut: refuse before dialling
		client.Close()
		return
	}
	server, err := net.DialTimeout("tcp", p.Target, 2*time.Second)
	if err != nil { // the target is down: the client sees a refusal
		client.Close()
		return
	}
	if !p.track(client, server) { // cut while dialling
		client.Close()
		server.Close()
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// One direction ended: end both, as a real connection would.
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done
	p.untrack(client, server)
}
