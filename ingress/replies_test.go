package ingress_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

type repliesAnswer struct {
	Replies []struct {
		Seq       uint64 `json:"seq"`
		TurnID    string `json:"turn_id"`
		SessionID string `json:"session_id"`
		Text      string `json:"text"`
		Kind      string `json:"kind"`
	} `json:"replies"`
}

func (b *testBundle) replies(t *testing.T, query string) (repliesAnswer, response) {
	t.Helper()
	r := b.do(t, http.MethodGet, "/v1/sessions/"+testKey+"/replies"+query, "", nil)
	var a repliesAnswer
	if r.status == http.StatusOK {
		if err := json.Unmarshal([]byte(r.raw), &a); err != nil {
			t.Fatal(err)
		}
		if a.Replies == nil {
			t.Fatalf("replies is not a list: %s", r.raw)
		}
	}
	return a, r
}

// outboxConsumers counts the consumers on the outbox stream: the delivery
// consumer plus one per reader waiting on a mailbox.
func (b *testBundle) outboxConsumers(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := b.res.Outbox.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

func TestReplies(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{delivery: true})

	a, r := b.replies(t, "")
	wantStatus(t, r, http.StatusOK)
	if len(a.Replies) != 0 {
		t.Fatalf("replies before any: %s", r.raw)
	}

	r1, r2 := testReply(1, "one"), testReply(2, "two")
	r2.Kind = session.ReplyKindNotice
	b.publishReply(t, r1, r1.ID)
	b.publishReply(t, r2, r2.ID)
	b.waitDelivered(t)

	a, r = b.replies(t, "?after=0")
	wantStatus(t, r, http.StatusOK)
	if len(a.Replies) != 2 {
		t.Fatalf("replies %s", r.raw)
	}
	got := a.Replies[0]
	if got.Text != "one" || got.TurnID != "turn-1" || got.SessionID != r1.SessionID || got.Kind != "reply" || got.Seq == 0 {
		t.Fatalf("first reply %+v", got)
	}
	if a.Replies[1].Text != "two" || a.Replies[1].Kind != "notice" || a.Replies[1].Seq <= got.Seq {
		t.Fatalf("second reply %+v", a.Replies[1])
	}

	a, r = b.replies(t, "?after="+strconv.FormatUint(got.Seq, 10))
	wantStatus(t, r, http.StatusOK)
	if len(a.Replies) != 1 || a.Replies[0].Text != "two" {
		t.Fatalf("after first: %s", r.raw)
	}
	a, r = b.replies(t, "?after="+strconv.FormatUint(a.Replies[0].Seq, 10))
	wantStatus(t, r, http.StatusOK)
	if len(a.Replies) != 0 {
		t.Fatalf("after last: %s", r.raw)
	}
	// An after beyond the end is fine: nothing yet.
	a, r = b.replies(t, "?after=1000000")
	wantStatus(t, r, http.StatusOK)
	if len(a.Replies) != 0 {
		t.Fatalf("after the end: %s", r.raw)
	}

	for _, q := range []string{"?after=-1", "?after=x", "?wait=soon", "?wait=-5s", "?after=18446744073709551615"} {
		_, r := b.replies(t, q)
		wantError(t, r, http.StatusBadRequest, "")
	}
	r = b.do(t, http.MethodGet, "/v1/sessions/agent:main:http:dm:../replies", "", nil)
	wantStatus(t, r, http.StatusBadRequest)

	// Every reader has removed its consumer.
	waitFor(t, "mailbox readers to go", func() error {
		if n := b.server.Readers(); n != 0 {
			return fmt.Errorf("%d readers", n)
		}
		if n := b.outboxConsumers(t); n > 1 {
			return fmt.Errorf("%d consumers on the outbox", n)
		}
		return nil
	})
}

func TestRepliesLongPoll(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{delivery: true})

	// Nothing comes: an empty list once the wait is over.
	start := time.Now()
	a, r := b.replies(t, "?after=0&wait=300ms")
	wantStatus(t, r, http.StatusOK)
	if len(a.Replies) != 0 {
		t.Fatalf("replies %s", r.raw)
	}
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("returned after %s, before the wait was over", el)
	}

	// A reply published while the poll waits ends it at once.
	const wait = 20 * time.Second
	type result struct {
		a       repliesAnswer
		r       response
		elapsed time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		req, _ := http.NewRequest(http.MethodGet, b.http.URL+"/v1/sessions/"+testKey+"/replies?after=0&wait=20s", nil)
		resp, err := b.client.Do(req)
		if err != nil {
			done <- result{r: response{status: -1, raw: err.Error()}}
			return
		}
		defer resp.Body.Close()
		var a repliesAnswer
		_ = json.NewDecoder(resp.Body).Decode(&a)
		done <- result{a: a, r: response{status: resp.StatusCode}, elapsed: time.Since(start)}
	}()
	waitFor(t, "the long poll to wait on the mailbox", func() error {
		if n := b.server.Readers(); n != 1 {
			return fmt.Errorf("%d readers", n)
		}
		return nil
	})
	if n := b.outboxConsumers(t); n != 1 {
		t.Fatalf("%d consumers on the outbox: a reader made one", n)
	}
	rep := testReply(1, "woken up")
	b.publishReply(t, rep, rep.ID)

	select {
	case res := <-done:
		if res.r.status != http.StatusOK || len(res.a.Replies) != 1 || res.a.Replies[0].Text != "woken up" {
			t.Fatalf("long poll answered %d %+v %s", res.r.status, res.a, res.r.raw)
		}
		if res.elapsed >= wait {
			t.Fatalf("long poll took %s", res.elapsed)
		}
	case <-time.After(wait):
		t.Fatal("long poll did not return after the reply")
	}
}

func TestRepliesLongPollEndsOnClose(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	done := make(chan response, 1)
	go func() {
		resp, err := b.client.Get(b.http.URL + "/v1/sessions/" + testKey + "/replies?wait=60s")
		if err != nil {
			done <- response{status: -1, raw: err.Error()}
			return
		}
		defer resp.Body.Close()
		var a repliesAnswer
		_ = json.NewDecoder(resp.Body).Decode(&a)
		done <- response{status: resp.StatusCode, raw: fmt.Sprint(len(a.Replies))}
	}()
	waitFor(t, "the long poll to wait on the mailbox", func() error {
		if n := b.server.Readers(); n != 1 {
			return fmt.Errorf("%d readers", n)
		}
		return nil
	})
	b.server.Close()
	select {
	case r := <-done:
		if r.status != http.StatusOK || r.raw != "0" {
			t.Fatalf("closed long poll: %d %s", r.status, r.raw)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Close did not end the long poll")
	}
}

// sseEvent is one server-sent event, or a comment.
type sseEvent struct {
	id, event, data, comment string
}

// openEvents opens the event stream and returns its events on a channel
// that is closed when the stream ends.
func (b *testBundle) openEvents(t *testing.T, ctx context.Context, query, lastEventID string) <-chan sseEvent {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.http.URL+"/v1/sessions/"+testKey+"/events"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		resp.Body.Close()
		t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	ch := make(chan sseEvent, 64)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev != (sseEvent{}) {
					ch <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, ":"):
				ev.comment = strings.TrimSpace(line[1:])
			default:
				k, v, _ := strings.Cut(line, ": ")
				switch k {
				case "id":
					ev.id = v
				case "event":
					ev.event = v
				case "data":
					ev.data = v
				}
			}
		}
	}()
	return ch
}

// nextReply returns the next reply event, skipping comments and retry hints.
func nextReply(t *testing.T, ch <-chan sseEvent) sseEvent {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatal("event stream ended")
			}
			if ev.event == "reply" {
				return ev
			}
		case <-deadline:
			t.Fatal("no reply event")
		}
	}
}

func replyText(t *testing.T, ev sseEvent) string {
	t.Helper()
	var v struct {
		Seq  uint64 `json:"seq"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal([]byte(ev.data), &v); err != nil {
		t.Fatalf("event data %q: %v", ev.data, err)
	}
	if strconv.FormatUint(v.Seq, 10) != ev.id {
		t.Fatalf("event id %s, data seq %d", ev.id, v.Seq)
	}
	return v.Text
}

func TestEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{delivery: true, heartbeat: 50 * time.Millisecond})
	r1 := testReply(1, "one")
	b.publishReply(t, r1, r1.ID)
	b.waitDelivered(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := b.openEvents(t, ctx, "?after=0", "")
	ev1 := nextReply(t, events)
	if got := replyText(t, ev1); got != "one" {
		t.Fatalf("first event %q", got)
	}
	// Replies that arrive later follow.
	r2 := testReply(2, "two")
	b.publishReply(t, r2, r2.ID)
	ev2 := nextReply(t, events)
	if got := replyText(t, ev2); got != "two" {
		t.Fatalf("second event %q", got)
	}
	// Idle streams get heartbeats.
	deadline := time.After(waitTimeout)
	for heartbeat := false; !heartbeat; {
		select {
		case ev := <-events:
			heartbeat = ev.comment == "heartbeat"
		case <-deadline:
			t.Fatal("no heartbeat")
		}
	}
	cancel()

	// A reconnect with Last-Event-ID resumes after it, whatever the URL says.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	events2 := b.openEvents(t, ctx2, "?after=0", ev1.id)
	if got := replyText(t, nextReply(t, events2)); got != "two" {
		t.Fatalf("resumed stream starts with %q", got)
	}

	// Close ends the stream.
	b.server.Close()
	select {
	case _, ok := <-events2:
		for ok {
			_, ok = <-events2
		}
	case <-time.After(waitTimeout):
		t.Fatal("Close did not end the event stream")
	}

	waitFor(t, "mailbox readers to go", func() error {
		if n := b.server.Readers(); n != 0 {
			return fmt.Errorf("%d readers", n)
		}
		if n := b.outboxConsumers(t); n > 1 {
			return fmt.Errorf("%d consumers on the outbox", n)
		}
		return nil
	})
}

func TestEventsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	wantError(t, b.do(t, http.MethodGet, "/v1/sessions/"+testKey+"/events?after=nope", "", nil), http.StatusBadRequest, "after")
	wantError(t, b.do(t, http.MethodGet, "/v1/sessions/"+testKey+"/events", "", map[string]string{"Last-Event-ID": "x"}),
		http.StatusBadRequest, "Last-Event-ID")
	wantError(t, b.do(t, http.MethodPost, "/v1/sessions/"+testKey+"/events", "", nil), http.StatusMethodNotAllowed, "not allowed")
}
