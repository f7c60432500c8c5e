package ingress_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

// The event stream forwards the lane's text deltas as "delta" events
// (without an id: they are not replayed) beside its replies, and nothing of
// other lanes.
func TestEventsForwardDeltas(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{delivery: true, heartbeat: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := b.openEvents(t, ctx, "?after=0", "")

	publish := func(key string, n int, text string) {
		t.Helper()
		data, _ := json.Marshal(session.Delta{SessionKey: key, SessionID: "s1", TurnID: "t1", Attempt: 1, N: n, Text: text})
		if err := b.nc.Publish(b.names.DeltaSubject(session.LaneToken(key)), data); err != nil {
			t.Fatal(err)
		}
	}
	// The stream subscribes to the deltas right after it opens: publish
	// until one arrives.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(waitTimeout)
	var first map[string]any
	for first == nil {
		select {
		case <-tick.C:
			publish("agent:main:http:dm:other", 1, "not ours")
			publish(testKey, 1, "hel")
		case ev, ok := <-events:
			if !ok {
				t.Fatal("event stream ended")
			}
			if ev.event != "delta" {
				continue
			}
			if ev.id != "" {
				t.Errorf("delta event with id %q", ev.id)
			}
			if err := json.Unmarshal([]byte(ev.data), &first); err != nil {
				t.Fatalf("delta data %q: %v", ev.data, err)
			}
		case <-deadline:
			t.Fatal("no delta event")
		}
	}
	if first["text"] != "hel" || first["turn_id"] != "t1" || first["session_id"] != "s1" || first["n"] != 1.0 || first["attempt"] != 1.0 {
		t.Errorf("delta event %v", first)
	}
	tick.Stop()
	// Drain the deltas still queued, then a reply arrives as ever.
	r1 := testReply(1, "hello")
	b.publishReply(t, r1, r1.ID)
	deadline = time.After(waitTimeout)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("event stream ended")
			}
			switch ev.event {
			case "delta":
				var d map[string]any
				if err := json.Unmarshal([]byte(ev.data), &d); err != nil || d["text"] != "hel" {
					t.Fatalf("delta of another lane, or bad data: %q", ev.data)
				}
				continue
			case "reply":
				if got := replyText(t, ev); got != "hello" {
					t.Fatalf("reply %q", got)
				}
				return
			}
		case <-deadline:
			t.Fatal("no reply event after the deltas")
		}
	}
}
