package testbroker

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// The proxy forwards bytes both ways, Cut breaks open connections and
// refuses new ones, Restore lets them through again.
func TestProxyCutAndRestore(t *testing.T) {
	p := NewProxy(t, echoServer(t))
	roundTrip := func() error {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		_, err = bufio.NewReader(c).ReadString('\n')
		return err
	}
	if err := roundTrip(); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	open, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	open.Write([]byte("x\n"))
	bufio.NewReader(open).ReadString('\n')
	p.Cut()
	if _, err := bufio.NewReader(open).ReadString('\n'); err == nil {
		t.Fatal("an open connection survived Cut")
	}
	if err := roundTrip(); err == nil {
		t.Fatal("a new connection got through a cut proxy")
	}
	p.Restore()
	if err := roundTrip(); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
}

// Stall holds every byte, on open connections, until Restore, which
// delivers what was held back.
func TestProxyStallAndRestore(t *testing.T) {
	p := NewProxy(t, echoServer(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	c.Write([]byte("before\n"))
	if s, err := r.ReadString('\n'); err != nil || s != "before\n" {
		t.Fatalf("through the proxy: %q, %v", s, err)
	}
	p.Stall()
	c.Write([]byte("held\n"))
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if s, err := r.ReadString('\n'); err == nil {
		t.Fatalf("a stalled proxy forwarded %q", s)
	}
	c.SetReadDeadline(time.Time{})
	p.Restore()
	if s, err := r.ReadString('\n'); err != nil || s != "held\n" {
		t.Fatalf("after Restore: %q, %v; want what was held back", s, err)
	}
}

// echoServer starts a TCP server that sends back what it reads, until the
// test ends, and returns its address.
func echoServer(t *testing.T) string {
	t.Helper()
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); bufio.NewReader(c).WriteTo(c) }()
		}
	}()
	return echo.Addr().String()
}
