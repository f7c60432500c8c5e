package broker_test

import (
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestSubjectPending counts the inbox messages of one lane from a
// sequence, with other lanes' messages interleaved, on a literal subject
// and on a partition filter; nothing from a seq past the end is zero.
func TestSubjectPending(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := srv.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames("fleet")
	res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a, b := names.InboxSubject(3, "a"), names.InboxSubject(3, "b")
	var seqsA []uint64
	for i := range 10 {
		subj := b
		if i%2 == 0 {
			subj = a
		}
		ack, err := js.Publish(t.Context(), subj, []byte("m"))
		if err != nil {
			t.Fatal(err)
		}
		if subj == a {
			seqsA = append(seqsA, ack.Sequence)
		}
	}
	stream := names.InboxStream()
	for _, c := range []struct {
		subject string
		from    uint64
		want    uint64
	}{
		{a, 0, 5},
		{a, seqsA[0], 5},
		{a, seqsA[0] + 1, 4},
		{a, seqsA[3], 2},
		{a, seqsA[4] + 1, 0},
		{b, seqsA[4], 1},
		{names.Prefix() + ".in.3.>", 1, 10},
		{names.Prefix() + ".in.3.>", 6, 5},
		{names.InboxSubject(4, "a"), 1, 0},
	} {
		got, err := broker.SubjectPending(t.Context(), res.JS, stream, c.subject, c.from)
		if err != nil {
			t.Fatalf("%s from %d: %v", c.subject, c.from, err)
		}
		if got != c.want {
			t.Errorf("%s from %d: %d messages, want %d", c.subject, c.from, got, c.want)
		}
	}
	if _, err := broker.SubjectPending(t.Context(), res.JS, "NO_SUCH_STREAM", a, 1); err == nil {
		t.Error("a stream that does not exist: no error")
	}
}
