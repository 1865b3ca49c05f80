package testbroker

import (
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy in front of a broker. Cut closes every connection
// and refuses new ones, as a broker that went away would; Stall keeps
// every connection open but forwards nothing, as a network that drops
// packets; Restore lets connections through again. Only the proxy's
// clients see the outage: the shared broker keeps running.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	cut     bool
	stalled bool
	moved   *sync.Cond // signalled when stalled goes false or the proxy closes
	closed  bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// NewProxy starts a proxy on a free loopback port that forwards to target
// (host:port). It stops when the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testbroker: proxy listen: %v", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.moved = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port: point the client here.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Stall stops forwarding bytes, both ways, on every connection, open or
// new, until Restore: clients wait for answers that do not come, until
// their own timeouts.
func (p *Proxy) Stall() {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

// Restore lets connections through again: new ones after Cut, every one
// after Stall (with what was held back).
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut, p.stalled = false, false
	p.moved.Broadcast()
	p.mu.Unlock()
}

// hold waits while the proxy is stalled; false if it closed meanwhile.
func (p *Proxy) hold() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.stalled && !p.closed {
		p.moved.Wait()
	}
	return !p.closed
}

func (p *Proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.moved.Broadcast()
	p.mu.Unlock()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(in) {
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil || !p.track(out) {
			if out != nil && err == nil {
				out.Close()
			}
			p.untrack(in)
			continue
		}
		p.wg.Add(2)
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer p.untrack(src)
	defer p.untrack(dst)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.hold() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
