package pgtest

import (
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"
)

// Proxy is an address that moves: a TCP forwarder in front of a server, as a Kubernetes
// Service, a virtual IP or a DNS name is in front of the primary (CloudNativePG's -rw Service,
// RDS's endpoint). Clients connect to the proxy's address. Cut takes the server away from it as
// a host gone from the network is (its connections fall silent), MoveTo gives it the next one. (A
// host that answers with a reset needs no proxy: the server's own end closes, as a killed
// server's does.)
type Proxy struct {
	ln   net.Listener
	user string
	mu   sync.Mutex
	to   *Server // nil while cut
	// conns are the open client connections, with the server connection each is joined to.
	conns map[*proxyConn]struct{}
	wg    sync.WaitGroup
}

type proxyConn struct {
	client, server net.Conn
	// silent: nothing more passes either way and nothing is closed (the client's reads wait
	// until its own timeouts).
	silent bool
}

// NewProxy starts a proxy in front of s on a free port of its own, closed when the test ends.
func NewProxy(t testing.TB, s *Server) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, user: s.user, to: s, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// URL is a libpq URL for database db through the proxy, as the server's own user.
func (p *Proxy) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User(p.user), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port())),
		Path: "/" + db, RawQuery: "sslmode=disable&connect_timeout=5"}
	return u.String()
}

// Cut takes the server away from the address, as when its host is gone from the network
// (powered off, partitioned): the connections open through the proxy stay open and pass nothing
// more either way, and new ones hear nothing either until MoveTo. A client notices only through
// its own timeouts.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.to = nil
	for c := range p.conns {
		c.silent = true
	}
}

// MoveTo sends every new connection to s.
func (p *Proxy) MoveTo(s *Server) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.to = s
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.client.Close()
		c.server.Close()
	}
	p.conns = map[*proxyConn]struct{}{}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		to := p.to
		p.mu.Unlock()
		c := &proxyConn{client: client, silent: to == nil}
		if to != nil {
			if c.server, err = net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(to.Port))); err != nil {
				client.Close()
				continue
			}
		} else {
			// Nothing answers: the client's connect timeout ends it.
			c.server = &nopConn{done: make(chan struct{})}
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, client, c.server)
		go p.pipe(c, c.server, client)
	}
}

// nopConn is the server end of a connection made while the address is cut: it never
// answers, and its reads end when it is closed.
type nopConn struct {
	net.Conn
	once sync.Once
	done chan struct{}
}

func (n *nopConn) Read([]byte) (int, error) {
	<-n.done
	return 0, net.ErrClosed
}

func (n *nopConn) Close() error {
	n.once.Do(func() { close(n.done) })
	return nil
}

// pipe copies from src to dst until either ends, then closes both. On a connection that fell
// silent it passes nothing more and closes nothing (Close does): the client is not told.
func (p *Proxy) pipe(c *proxyConn, src, dst net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		silent := c.silent
		p.mu.Unlock()
		if silent {
			if err != nil {
				return
			}
			continue
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil && err == nil {
				err = werr
			}
		}
		if err != nil {
			p.mu.Lock()
			if !c.silent {
				c.client.Close()
				c.server.Close()
				delete(p.conns, c)
			}
			p.mu.Unlock()
			return
		}
	}
}
