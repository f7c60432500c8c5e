package transcript_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestServer_ExpectLastSequencePerSubject pins the server behaviour Append
// relies on (nats-server v2.15.2, R1), so an upgrade that changes it fails
// here first.
func TestServer_ExpectLastSequencePerSubject(t *testing.T) {
	t.Parallel()
	b := setup(t)
	subj := b.names.TranscriptSubject("probe")
	other := b.names.TranscriptSubject("other")
	pub := func(id string, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
		m := nats.NewMsg(subj)
		m.Data = []byte(`{}`)
		if id != "" {
			opts = append(opts, jetstream.WithMsgID(id))
		}
		return b.js.PublishMsg(b.ctx, m, opts...)
	}

	// Another subject's messages do not count: the check is per subject.
	if _, err := b.js.Publish(b.ctx, other, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}

	// 0 on an empty subject succeeds.
	ack, err := pub("a", jetstream.WithExpectLastSequencePerSubject(0))
	if err != nil {
		t.Fatalf("expect 0 on empty subject: %v", err)
	}
	if ack.Sequence != 2 {
		t.Fatalf("first seq = %d, want 2", ack.Sequence)
	}

	// 0 on a non-empty subject fails with 10071 and names the actual tail.
	_, err = pub("b", jetstream.WithExpectLastSequencePerSubject(0))
	ae := apiErr(t, err)
	t.Logf("expect 0 on non-empty subject: %v", err)
	if ae.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence || ae.Description != "wrong last sequence: 2" {
		t.Fatalf("got err_code=%d %q, want 10071 %q", ae.ErrorCode, ae.Description, "wrong last sequence: 2")
	}

	// A stale expectation names the actual tail too.
	if _, err := pub("c", jetstream.WithExpectLastSequencePerSubject(2)); err != nil {
		t.Fatal(err)
	}
	_, err = pub("d", jetstream.WithExpectLastSequencePerSubject(2))
	if ae := apiErr(t, err); ae.ErrorCode != 10071 || ae.Description != "wrong last sequence: 3" {
		t.Fatalf("stale expectation: err_code=%d %q, want 10071 %q", ae.ErrorCode, ae.Description, "wrong last sequence: 3")
	}

	// Resending a stored message (same Msg-Id) with its old expectation:
	// the expected-seq check runs before de-duplication, so it is a 10071
	// naming the resent message's own seq, not a duplicate ack. This is why
	// Append resolves a 10071 on a resend by reading the tail's entry id.
	_, err = pub("c", jetstream.WithExpectLastSequencePerSubject(2))
	if ae := apiErr(t, err); ae.ErrorCode != 10071 || ae.Description != "wrong last sequence: 3" {
		t.Fatalf("resend with old expectation: err_code=%d %q, want 10071 %q", ae.ErrorCode, ae.Description, "wrong last sequence: 3")
	}

	// With an expectation that holds, the same Msg-Id is dropped as a
	// duplicate and the ack names the original seq.
	ack, err = pub("c", jetstream.WithExpectLastSequencePerSubject(3))
	if err != nil {
		t.Fatalf("resend with current expectation: %v", err)
	}
	if !ack.Duplicate || ack.Sequence != 3 {
		t.Fatalf("resend with current expectation: ack %+v, want duplicate of seq 3", ack)
	}

	info, err := b.res.Transcripts.Info(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("stream holds %d messages, want 3", info.State.Msgs)
	}
}
