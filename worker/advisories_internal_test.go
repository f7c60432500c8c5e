package worker

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
)

const advTestTTL = 3 * time.Second

// TestAdvisoriesRefused: the subscriptions to the inbox advisories of a user
// whose permissions refuse them are found refused (the worker then reads the
// streams' identities every inboxCheckPoll); the worker role's are not.
func TestAdvisoriesRefused(t *testing.T) {
	t.Parallel()
	var users []broker.ServerUser
	for _, role := range []string{broker.RoleWorker, broker.RoleHealthcheck} {
		users = append(users, broker.ServerUser{User: role, Password: role + "-pw", Role: role})
	}
	srv, err := broker.StartServer(broker.ServerConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	subjects := broker.MustNames(broker.DefaultPrefix).InboxAdvisories()
	for _, c := range []struct {
		role    string
		refused bool
	}{{broker.RoleWorker, false}, {broker.RoleHealthcheck, true}} {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(c.role, c.role+"-pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		ch := make(chan *nats.Msg, 1)
		for _, s := range subjects {
			if _, err := nc.ChanSubscribe(s, ch); err != nil {
				t.Fatal(err)
			}
		}
		err = advisoriesRefused(nc, subjects)
		if (err != nil) != c.refused {
			t.Errorf("%s: refused %v, want refused %t", c.role, err, c.refused)
		}
		nc.Close()
	}
}

// TestOldDeletionAdvisoryLeavesNewIncarnation: an advisory of the inbox
// stream's deletion (or of its workers consumer's) taken after a reader
// installed the incarnation made after it does not mark that incarnation
// stale; one of the deletion of the set's incarnation does.
func TestOldDeletionAdvisoryLeavesNewIncarnation(t *testing.T) {
	t.Parallel()
	srv, _, js, names, res := provisionFleet(t, advTestTTL)
	wnc := srv.Connect(t)
	w, err := New(wnc, natstest.JetStream(t, wnc), res, Config{ID: "w1", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: advTestTTL})
	if err != nil {
		t.Fatal(err)
	}
	anc := srv.Connect(t)
	advs := make(chan *nats.Msg, 64)
	for _, s := range names.InboxAdvisories() {
		if _, err := anc.ChanSubscribe(s, advs); err != nil {
			t.Fatal(err)
		}
	}
	if err := anc.Flush(); err != nil {
		t.Fatal(err)
	}
	stream := names.InboxStream()
	// next is the next advisory of the deletion of the stream's workers
	// consumer sent at since or later.
	next := func(since time.Time) *nats.Msg {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case m := <-advs:
				if a, ok := names.ParseInboxAdvisory(m.Subject); ok && a.Action == broker.AdvisoryDeleted && a.Consumer && !sentBefore(m.Data, since) {
					return m
				}
			case <-deadline:
				t.Fatal("no advisory of the consumer's deletion")
			}
		}
	}
	// streamDeleted is an advisory of the stream's deletion at time at.
	// The server's own may be lost: it queues it to the stream's send
	// loop as it stops that loop.
	streamDeleted := func(at time.Time) *nats.Msg {
		data, err := json.Marshal(map[string]any{"type": "io.nats.jetstream.advisory.v1.stream_action", "timestamp": at.UTC(), "stream": stream, "action": "delete"})
		if err != nil {
			t.Fatal(err)
		}
		return &nats.Msg{Subject: "$JS.EVENT.ADVISORY.STREAM.DELETED." + stream, Data: data}
	}
	provision := func() {
		t.Helper()
		if _, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: advTestTTL}); err != nil {
			t.Fatal(err)
		}
	}
	// reopen installs the stream's current incarnation, as the pull loop
	// does when its pull tells it the old one is gone.
	reopen := func() *broker.Inbox {
		t.Helper()
		in, err := w.inboxes.Reopen(t.Context(), w.inboxes.ByName(stream), true)
		if err != nil {
			t.Fatal(err)
		}
		if in.Stale() || w.inboxes.ByName(stream) != in {
			t.Fatal("the set did not take the new incarnation")
		}
		return in
	}
	adv := &inboxAdvisories{due: map[string]bool{}, kick: make(chan struct{}, 1)}

	var cur *broker.Inbox
	for _, consumer := range []bool{false, true} {
		since := time.Now()
		var old *nats.Msg
		if consumer {
			if err := js.DeleteConsumer(t.Context(), stream, names.WorkersConsumer()); err != nil {
				t.Fatal(err)
			}
			old = next(since)
		} else {
			if err := js.DeleteStream(t.Context(), stream); err != nil {
				t.Fatal(err)
			}
			old = streamDeleted(time.Now())
		}
		provision()
		in := reopen()
		w.onInboxAdvisory(old, adv)
		if in.Stale() {
			t.Errorf("consumer %t: an advisory of the deletion before it marked the new incarnation stale", consumer)
		}
		if !adv.take()[stream] {
			t.Errorf("consumer %t: the advisory was not noted", consumer)
		}
		// The deletion of the incarnation the set has marks it stale.
		since = time.Now()
		if err := js.DeleteConsumer(t.Context(), stream, names.WorkersConsumer()); err != nil {
			t.Fatal(err)
		}
		w.onInboxAdvisory(next(since), adv)
		if !in.Stale() {
			t.Errorf("consumer %t: an advisory of the current consumer's deletion did not mark the incarnation stale", consumer)
		}
		provision()
		cur = reopen()
	}
	// The deletion of the stream's incarnation the set has marks it stale.
	w.onInboxAdvisory(streamDeleted(time.Now()), adv)
	if !cur.Stale() {
		t.Error("an advisory of the current stream's deletion did not mark the incarnation stale")
	}
	if !adv.take()[stream] {
		t.Error("the advisory of the current stream's deletion was not noted")
	}
}

// TestChangeAdvisoryReadOnlyInDoubt: a stream told of only as changed
// (STREAM.UPDATED) is read again only while it is away (a read is to be
// tried again) or stale; told of as made or deleted, it is read again.
func TestChangeAdvisoryReadOnlyInDoubt(t *testing.T) {
	t.Parallel()
	srv, _, _, names, res := provisionFleet(t, advTestTTL)
	wnc := srv.Connect(t)
	w, err := New(wnc, natstest.JetStream(t, wnc), res, Config{ID: "w1", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: advTestTTL})
	if err != nil {
		t.Fatal(err)
	}
	stream := names.InboxStream()
	none := map[string]*reopenRetry{}
	if got := w.toReread(map[string]bool{stream: false}, none); len(got) != 0 {
		t.Errorf("a change of a current stream: read again %v", got)
	}
	if got := w.toReread(map[string]bool{stream: true}, none); len(got) != 1 {
		t.Errorf("a making or deletion: read again %v, want %s", got, stream)
	}
	if got := w.toReread(map[string]bool{stream: false}, map[string]*reopenRetry{stream: {}}); len(got) != 1 {
		t.Errorf("a change of a stream away: read again %v, want %s", got, stream)
	}
	w.inboxes.ByName(stream).MarkStale()
	if got := w.toReread(map[string]bool{stream: false}, none); len(got) != 1 {
		t.Errorf("a change of a stale stream: read again %v, want %s", got, stream)
	}
}

// TestInboxIdentityMetadataEdited: an edit of the inbox stream that removes
// its fleet_inbox_id (the stream's change is not read again on its
// advisory) is found by the periodic check, which marks the stream stale;
// putting it back is found and the stream taken again.
func TestInboxIdentityMetadataEdited(t *testing.T) {
	t.Parallel()
	srv, _, js, names, res := provisionFleet(t, advTestTTL)
	wnc := srv.Connect(t)
	cfg := Config{ID: "w1", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: advTestTTL}
	cfg.inboxCheck = inboxCheckConfig{live: 2 * time.Second, poll: time.Hour}
	w, err := New(wnc, natstest.JetStream(t, wnc), res, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, w, "worker w1")
	stream := names.InboxStream()
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	id := sc.Metadata[broker.InboxIDMetadata]
	edit := func(md map[string]string) {
		t.Helper()
		c := sc
		c.Metadata = md
		if _, err := js.UpdateStream(t.Context(), c); err != nil {
			t.Fatal(err)
		}
	}
	edit(map[string]string{})
	natstest.WaitFor(t, 30*time.Second, "the stream stale", func() error {
		if in := w.inboxes.ByName(stream); in == nil || !in.Stale() {
			return fmt.Errorf("not stale")
		}
		return nil
	})
	edit(map[string]string{broker.InboxIDMetadata: id})
	natstest.WaitFor(t, 30*time.Second, "the stream taken again", func() error {
		if in := w.inboxes.ByName(stream); in == nil || in.Stale() || in.ID != id {
			return fmt.Errorf("not taken again")
		}
		return nil
	})
}

// TestReconnectCheckSkipsStreamsCheckedSince: the identity check that
// follows a reconnect (checkAllInboxes with the reconnect's time) does not
// read again a stream whose identity a read begun after the reconnect
// found current (a pull loop checks its stream before it takes a delivery
// after a reconnect); the periodic check reads every stream, and so does
// the reconnect check a stream not read since.
func TestReconnectCheckSkipsStreamsCheckedSince(t *testing.T) {
	t.Parallel()
	srv, nc, js, names, res := provisionFleet(t, advTestTTL)
	w, err := New(nc, js, res, Config{ID: "w1", Names: names, Backend: echo.Backend(echo.Options{}), LeaseTTL: advTestTTL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.ajs.CleanupPublisher)
	stream := names.InboxStream()
	obs := srv.Connect(t)
	reads, err := obs.SubscribeSync("$JS.API.STREAM.INFO.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Flush(); err != nil {
		t.Fatal(err)
	}
	// counted is the number of reads of the stream the worker's
	// connection made since the last call: a marker it sends after them
	// arrives after them.
	marker := 0
	counted := func() int {
		t.Helper()
		marker++
		m := fmt.Sprintf("$JS.API.STREAM.INFO.marker-%d", marker)
		if err := nc.Publish(m, nil); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			r, err := reads.NextMsg(30 * time.Second)
			if err != nil {
				t.Fatalf("the marker did not arrive: %v", err)
			}
			if r.Subject == m {
				return n
			}
			if r.Subject == "$JS.API.STREAM.INFO."+stream {
				n++
			}
		}
	}
	reconnected := broker.Mono()
	// A pull loop's check after the reconnect.
	in := w.inboxes.ByName(stream)
	if got, err := w.inboxes.Reopen(t.Context(), in, false); err != nil || got != in {
		t.Fatalf("the check: %v, %v", got, err)
	}
	counted()
	retryAt := map[string]*reopenRetry{}
	w.checkAllInboxes(t.Context(), retryAt, reconnected)
	if n := counted(); n != 0 {
		t.Errorf("the reconnect check read a stream checked since %d times", n)
	}
	w.checkAllInboxes(t.Context(), retryAt, 0)
	if n := counted(); n != 1 {
		t.Errorf("the periodic check read the stream %d times, want once", n)
	}
	w.checkAllInboxes(t.Context(), retryAt, broker.Mono())
	if n := counted(); n != 1 {
		t.Errorf("the reconnect check read a stream not checked since %d times, want once", n)
	}
}
