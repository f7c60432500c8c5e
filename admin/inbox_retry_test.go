package admin_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestMigrateInboxMapWriteWithALostAnswer: each write of the inbox map is
// first applied with its answer lost (the write returns a timeout, as when
// the connection or the map stream's leader goes away just after storing
// it), then refused with "JetStream system temporarily unavailable". The
// migration cannot tell the first from a write that was not applied: it
// writes again with the same expected revision, is refused because the
// revision moved, reads the map back, finds its own write and goes on,
// instead of failing as if another migration had changed the map. With a
// worker and lanes that keep posting, the fleet goes from 1 to 2 inbox
// streams and back to 1; each lane's transcript holds exactly the messages
// it posted, once each, in order, and the map, the streams' subjects and
// what each stream holds are those of the target.
func TestMigrateInboxMapWriteWithALostAnswer(t *testing.T) {
	f := newMigrateFleet(t)
	ps := startPosters(t, func() jetstream.JetStream { return natstest.JetStream(t, f.srv.Connect(t)) }, f.names, "lost", 4)
	ps.waitPosted(t, 2)
	lossy := &lossyMapJS{JetStream: f.js, bucket: f.names.InboxMapBucket()}
	fl := *f.fl
	fl.JS = lossy
	for _, target := range []int{2, 1} {
		var o admin.MigrateOptions
		o.Batch, o.DrainTimeout = 16, 60*time.Second
		if _, err := fl.MigrateInbox(t.Context(), target, o); err != nil {
			t.Fatalf("migrate to %d: %v", target, err)
		}
		f.checkMigratedTo(target)
		ps.waitPosted(t, 2)
	}
	if lossy.lost < 4 {
		t.Fatalf("%d map writes lost their answer, want at least 4", lossy.lost)
	}
	ps.stop(t)
	ps.checkTranscripts(t, f.fl)
}

// lossyMapJS hands out the inbox map bucket as a lossyMapKV.
type lossyMapJS struct {
	jetstream.JetStream
	bucket string
	lost   int
}

func (js *lossyMapJS) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	kv, err := js.JetStream.KeyValue(ctx, bucket)
	if err != nil || bucket != js.bucket {
		return kv, err
	}
	return &lossyMapKV{KeyValue: kv, js: js}, nil
}

// lossyMapKV's updates go in threes: applied with the answer lost, refused
// as unavailable, then made.
type lossyMapKV struct {
	jetstream.KeyValue
	js *lossyMapJS
	n  int
}

func (kv *lossyMapKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	kv.n++
	switch kv.n % 3 {
	case 1:
		if _, err := kv.KeyValue.Update(ctx, key, value, last); err != nil {
			return 0, err
		}
		kv.js.lost++
		return 0, fmt.Errorf("the answer was lost: %w", context.DeadlineExceeded)
	case 2:
		return 0, &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}
	}
	return kv.KeyValue.Update(ctx, key, value, last)
}
