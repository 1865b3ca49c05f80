package conn

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
)

func TestBroken(t *testing.T) {
	reset := &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.ECONNRESET)}
	for _, err := range []error{reset, fmt.Errorf("flush: %w", reset), io.EOF, io.ErrUnexpectedEOF, net.ErrClosed, syscall.EPIPE, syscall.ECONNREFUSED} {
		if !Broken(err) {
			t.Errorf("Broken(%v) = false", err)
		}
	}
	for _, err := range []error{nil, errors.New("ERR wrong type"), fmt.Errorf("api error 400")} {
		if Broken(err) {
			t.Errorf("Broken(%v) = true", err)
		}
	}
}
