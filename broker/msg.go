package broker

import "github.com/nats-io/nats.go"

// NewMsg returns a message on subject with data and the headers given as
// name, value pairs, each name set once (as nats.Header.Set would). It is
// nats.NewMsg plus the Set calls with the header values in one allocation,
// for the publishes of a turn. A JetStream publish option that only sets a
// header (the Msg-Id, an expected last subject sequence) can be given here as
// that header: jetstream's PublishMsg without options then sends the same
// message as with them.
func NewMsg(subject string, data []byte, hdrs ...string) *nats.Msg {
	n := len(hdrs) / 2
	h := make(nats.Header, n)
	vals := make([]string, n)
	for i := range n {
		vals[i] = hdrs[2*i+1]
		// Capacity 1: an Add to one header never writes into the next's.
		h[hdrs[2*i]] = vals[i : i+1 : i+1]
	}
	return &nats.Msg{Subject: subject, Data: data, Header: h}
}
