package inbox

import (
	"crypto/sha256"
	"encoding/hex"
)

// DeriveID returns an id for a message that carries none, from broker
// coordinates that name it across redeliveries: e.g. DeriveID("kafka",
// topic, partition, offset) or DeriveID("redis", stream, entryID). It is
// "sha256:" and the hex SHA-256 of the parts, each prefixed with its
// length so that ("ab", "c") and ("a", "bc") differ.
//
// Only coordinates that a redelivery keeps are of use: a Kafka offset or
// a Redis stream entry id are; an AMQP delivery tag, a NATS stream
// sequence of a republished message, or a hash of the payload (two
// distinct orders with the same body) are not.
func DeriveID(parts ...string) string {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		l := uint64(len(p))
		for i := range n {
			n[i] = byte(l >> (8 * i))
		}
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
