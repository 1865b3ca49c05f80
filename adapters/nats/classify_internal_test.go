package natsoutbox

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/txoutbox/txoutbox/outbox"
)

// A connection that breaks under a publish call fails it with the socket's
// error (PublishMsgAsync flushes when its buffer fills): that is an outage
// of the destination, never a failure that spends the event's attempts.
func TestClassifyTransportErrorsAsUnavailable(t *testing.T) {
	writeReset := &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.ECONNRESET)}
	for _, err := range []error{
		writeReset,
		fmt.Errorf("flush: %w", writeReset),
		&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.EPIPE)},
		io.EOF,
		net.ErrClosed,
		nats.ErrDisconnected,
		nats.ErrTimeout,
	} {
		if down, _ := outbox.IsUnavailable(classify("id", "s", err)); !down {
			t.Errorf("classify(%v) is not outbox.Unavailable", err)
		}
	}
	for _, err := range []error{errors.New("nats: some server error"), nats.ErrBadSubject} {
		if down, _ := outbox.IsUnavailable(classify("id", "s", err)); down {
			t.Errorf("classify(%v) is outbox.Unavailable, want an ordinary failure", err)
		}
	}
}
