package middleware

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
)

// bufferedWriter holds a handler's status, headers and body until the
// middleware has decided the transaction.
type bufferedWriter struct {
	w      http.ResponseWriter
	header http.Header // nil until the handler asks: a clone of w's
	status int
	body   bytes.Buffer
}

var bufferPool = sync.Pool{New: func() any { return new(bufferedWriter) }}

// maxPooledBody keeps huge responses from pinning memory in the pool.
const maxPooledBody = 64 << 10

func getBuffer(w http.ResponseWriter) *bufferedWriter {
	bw := bufferPool.Get().(*bufferedWriter)
	bw.w = w
	return bw
}

func putBuffer(bw *bufferedWriter) {
	if bw.body.Cap() > maxPooledBody {
		return
	}
	bw.w, bw.header, bw.status = nil, nil, 0
	bw.body.Reset()
	bufferPool.Put(bw)
}

func (bw *bufferedWriter) Header() http.Header {
	if bw.header == nil {
		bw.header = bw.w.Header().Clone()
		if bw.header == nil {
			bw.header = make(http.Header)
		}
	}
	return bw.header
}

func (bw *bufferedWriter) WriteHeader(code int) {
	checkCode(code)
	if bw.status != 0 || code < 200 {
		return // superfluous, or informational: dropped while buffering
	}
	bw.status = code
}

func (bw *bufferedWriter) Write(p []byte) (int, error) {
	if bw.status == 0 {
		bw.status = http.StatusOK
	}
	if !bodyAllowed(bw.status) {
		return 0, http.ErrBodyNotAllowed
	}
	return bw.body.Write(p)
}

// WriteString lets io.WriteString skip a copy.
func (bw *bufferedWriter) WriteString(s string) (int, error) {
	if bw.status == 0 {
		bw.status = http.StatusOK
	}
	if !bodyAllowed(bw.status) {
		return 0, http.ErrBodyNotAllowed
	}
	return bw.body.WriteString(s)
}

// Flush does nothing: no byte may leave before the commit.
func (bw *bufferedWriter) Flush() {}

// FlushError is what http.ResponseController.Flush calls; see Flush.
func (bw *bufferedWriter) FlushError() error { return nil }

// Hijack refuses: see ErrHijack.
func (bw *bufferedWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, ErrHijack
}

// Unwrap lets http.ResponseController reach the deadlines of the real
// writer; Flush and Hijack stop here.
func (bw *bufferedWriter) Unwrap() http.ResponseWriter { return bw.w }

func (bw *bufferedWriter) statusCode() int {
	if bw.status == 0 {
		return http.StatusOK
	}
	return bw.status
}

// sendTo writes the buffered response to w.
func (bw *bufferedWriter) sendTo(w http.ResponseWriter, r *http.Request) {
	status := bw.statusCode()
	if bw.header != nil {
		h := w.Header()
		for k := range h {
			if _, ok := bw.header[k]; !ok {
				delete(h, k)
			}
		}
		for k, v := range bw.header {
			h[k] = v
		}
	}
	n := bw.body.Len()
	if n > 0 && r.Method != http.MethodHead {
		h := w.Header()
		if _, ok := h["Content-Length"]; !ok && h.Get("Transfer-Encoding") == "" {
			h["Content-Length"] = []string{strconv.Itoa(n)}
		}
	}
	w.WriteHeader(status)
	if n > 0 {
		_, _ = w.Write(bw.body.Bytes())
	}
}

// streamWriter passes the response through and records its status.
type streamWriter struct {
	w      http.ResponseWriter
	status int
}

func (sw *streamWriter) Header() http.Header { return sw.w.Header() }

func (sw *streamWriter) WriteHeader(code int) {
	checkCode(code)
	if code >= 200 && sw.status == 0 {
		sw.status = code
	}
	sw.w.WriteHeader(code)
}

func (sw *streamWriter) Write(p []byte) (int, error) {
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	return sw.w.Write(p)
}

func (sw *streamWriter) Flush() { _ = sw.FlushError() }

func (sw *streamWriter) FlushError() error {
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	return http.NewResponseController(sw.w).Flush()
}

func (sw *streamWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, ErrHijack
}

func (sw *streamWriter) Unwrap() http.ResponseWriter { return sw.w }

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// checkCode panics like net/http does on a status it cannot send; the
// panic happens in the handler, so the transaction rolls back.
func checkCode(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
}
