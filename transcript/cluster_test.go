package transcript_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
)

// TestAppend_ContentionR3: writers racing on one transcript of an R3 stream,
// where the server also answers 10164 while another write to the subject is
// in flight. Every append either lands once or is a ConflictError; nothing is
// lost or doubled.
func TestAppend_ContentionR3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster; skipped with -short")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := natstest.RunCluster(t, 3)
	nc := c.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames("fleet")
	// Provisioning is idempotent; on a loaded machine the first R3 creates
	// can time out while the cluster settles.
	natstest.WaitFor(t, 2*time.Minute, "R3 provisioning", func() error {
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := broker.Provision(pctx, js, broker.ProvisionConfig{Names: names, Replicas: 3})
		return err
	})

	// Count the server's answers on the way through.
	var codes sync.Map // err_code -> *atomic.Int64
	count := func(code int) {
		v, _ := codes.LoadOrStore(code, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	spy := &flakyJS{JetStream: js}
	spy.publish = func(_ int32, real func() (*jetstream.PubAck, error)) (*jetstream.PubAck, error) {
		ack, err := real()
		var ae *jetstream.APIError
		switch {
		case err == nil:
			count(0)
		case errors.As(err, &ae):
			count(int(ae.ErrorCode))
		default:
			count(-1)
		}
		return ack, err
	}
	log, err := transcript.New(spy, names, nil)
	if err != nil {
		t.Fatal(err)
	}

	const writers, each = 4, 20
	const session = "contended"
	var (
		wg        sync.WaitGroup
		conflicts atomic.Int64
		mu        sync.Mutex
		stored    = map[string]uint64{} // entry id -> seq Append returned
	)
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := 0; i < each; {
				last, _, err := log.LastSeq(ctx, session)
				if err != nil {
					errs <- err
					return
				}
				e := &transcript.Entry{Kind: transcript.KindMessage, Role: transcript.RoleAssistant, Content: fmt.Sprintf("w%d-%d", w, i)}
				seq, err := log.Append(ctx, session, last, e)
				var ce *transcript.ConflictError
				switch {
				case errors.As(err, &ce):
					conflicts.Add(1)
					continue
				case err != nil:
					errs <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
				mu.Lock()
				stored[e.ID] = seq
				mu.Unlock()
				i++
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	entries, _, err := log.Load(ctx, session)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != writers*each {
		seen := map[string]bool{}
		for _, e := range entries {
			seen[e.ID] = true
		}
		for id, seq := range stored {
			if !seen[id] {
				t.Logf("missing %s seq %d", id, seq)
			}
		}
		stream, _ := js.Stream(ctx, names.TranscriptStream())
		info, _ := stream.Info(ctx)
		t.Logf("stream state %+v; last loaded %d", info.State, entries[len(entries)-1].Seq)
		entries2, _, err := log.Load(ctx, session)
		t.Logf("reload: %d %v", len(entries2), err)
		t.Fatalf("%d entries stored, want %d", len(entries), writers*each)
	}
	for _, e := range entries {
		if seq, ok := stored[e.ID]; !ok || seq != e.Seq {
			t.Fatalf("entry %s at seq %d: Append reported %d (known %v)", e.ID, e.Seq, seq, ok)
		}
		delete(stored, e.ID)
	}
	summary := map[int]int64{}
	codes.Range(func(k, v any) bool { summary[k.(int)] = v.(*atomic.Int64).Load(); return true })
	t.Logf("R3, %d writers x %d appends: %d conflicts returned; server answers by err_code (0 = stored): %v",
		writers, each, conflicts.Load(), summary)
}
