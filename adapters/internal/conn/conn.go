// Package conn recognises, for the connectors, the errors of a connection
// that broke or could not be made: the destination is unreachable for now
// (outbox.Unavailable), whatever its protocol.
package conn

import (
	"errors"
	"io"
	"net"
	"syscall"
)

// Broken reports whether err comes from the connection rather than from
// the destination's answer: an end of stream, a closed socket, a
// connection refused, reset, aborted or cut (broken pipe), or any
// net.Error (a dial, read or write error, timeouts included).
func Broken(err error) bool {
	if err == nil {
		return false
	}
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, syscall.EPIPE):
		return true
	}
	var nerr net.Error
	return errors.As(err, &nerr)
}
