package transcript_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
)

// TestMain fails the run if goroutines outlive the tests.
func TestMain(m *testing.M) { natstest.VerifyNoLeaks(m, 5*time.Second) }

// testBundle is what most tests need: a server with the fleet provisioned,
// and a Log on it.
type testBundle struct {
	ctx    context.Context
	server *natstest.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	names  broker.Names
	res    *broker.Resources
	log    *transcript.Log
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	s := natstest.RunServer(t)
	nc := s.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames("fleet")
	res, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: names})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	log, err := transcript.New(js, names, nil)
	if err != nil {
		t.Fatalf("new log: %v", err)
	}
	return &testBundle{ctx: ctx, server: s, nc: nc, js: js, names: names, res: res, log: log}
}

func msg(role, content string) *transcript.Entry {
	return &transcript.Entry{Kind: transcript.KindMessage, Role: role, Content: content}
}

// appendAll appends entries in order and returns the last seq.
func appendAll(t *testing.T, b *testBundle, session string, lastSeq uint64, entries ...*transcript.Entry) uint64 {
	t.Helper()
	for _, e := range entries {
		seq, err := b.log.Append(b.ctx, session, lastSeq, e)
		if err != nil {
			t.Fatalf("append %s/%s after %d: %v", e.Kind, e.Content, lastSeq, err)
		}
		lastSeq = seq
	}
	return lastSeq
}

func load(t *testing.T, b *testBundle, session string) ([]transcript.Entry, uint64) {
	t.Helper()
	entries, last, err := b.log.Load(b.ctx, session)
	if err != nil {
		t.Fatalf("load %s: %v", session, err)
	}
	return entries, last
}

// requireConflict checks that err is a *ConflictError with the given tail.
func requireConflict(t *testing.T, err error, actual uint64) {
	t.Helper()
	if !errors.Is(err, transcript.ErrConflict) {
		t.Fatalf("err = %v, want ErrConflict", err)
	}
	var ce *transcript.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %T %v, want *ConflictError", err, err)
	}
	if ce.Actual != actual {
		t.Fatalf("ConflictError.Actual = %d, want %d (%v)", ce.Actual, actual, err)
	}
}

// apiErr extracts the JetStream API error of err, or fails.
func apiErr(t *testing.T, err error) *jetstream.APIError {
	t.Helper()
	var ae *jetstream.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("err = %T %v, want a *jetstream.APIError", err, err)
	}
	return ae
}
