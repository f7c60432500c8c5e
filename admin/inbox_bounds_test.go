package admin_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestMigrateInboxSlowCallsBoundedEach: the migration runs over a
// connection that delays every answer of the server by 25 ms (a slow
// cluster), with the bound of one call's attempt cut to 1 s. Each call is
// well within it, but a step that makes a call per lane or per partition
// is not: a drain round reads the last message of each of the 80 lanes of
// one partition (2 s and more, every round until the partition has
// drained), and the
// purge of a batch of all 32 partitions that move makes 3 calls per
// partition (2.4 s, made again whole on each attempt). Each call has its
// own bound, so the migration completes, every lane's message answered
// once, in order, and the map, the subjects and what each stream holds are
// those of 2 streams. With one bound over a whole round, the drain of the
// first case could never finish a round; with one over a whole purge, the
// purge of the second could never finish an attempt.
func TestMigrateInboxSlowCallsBoundedEach(t *testing.T) {
	for _, c := range []struct {
		name  string
		lanes int // lanes of the fleet lane's partition with a message
		batch int
	}{
		{"lanes", 80, 8},
		{"partitions", 1, 64},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newMigrateFleet(t)
			lanes := []*migrateFleet{f}
			for i := 1; i < c.lanes; i++ {
				g := *f
				g.useLaneNamed(fmt.Sprintf("many-%d", i), f.p)
				lanes = append(lanes, &g)
			}
			acks := make([]*jetstream.PubAck, len(lanes))
			for i, l := range lanes {
				acks[i] = l.post("first")
			}
			for i, l := range lanes {
				l.waitCommitted(0, acks[i].Sequence)
			}

			slow := connectSlow(t, f.srv, 25*time.Millisecond)
			fl, err := admin.Open(t.Context(), natstest.JetStream(t, slow), f.names)
			if err != nil {
				t.Fatal(err)
			}
			o := admin.MigrateOptions{Batch: c.batch, DrainTimeout: 45 * time.Second, RetryWait: 30 * time.Second}
			admin.SetMigrateAttemptTimeout(&o, time.Second)
			rep, err := fl.MigrateInbox(t.Context(), 2, o)
			if err != nil {
				t.Fatalf("migrate to 2: %v", err)
			}
			t.Logf("1 -> 2 streams: %d partitions moved in %s (longest drain %s)", rep.Moved, rep.Took, rep.Drain)
			if rep.Moved != 32 {
				t.Fatalf("the report %+v, want 32 partitions moved", rep)
			}
			f.checkMigratedTo(2)
			f.postAfterTheMove()
			if users := f.users(); !slices.Equal(users, []string{"first", "after"}) {
				t.Fatalf("user entries %q, want first, after", users)
			}
			for _, l := range lanes[1:] {
				if users := l.users(); !slices.Equal(users, []string{"first"}) {
					t.Fatalf("lane %s: user entries %q, want first", l.lane, users)
				}
			}
		})
	}
}

// useLaneNamed makes the fleet's lane the first of partition p whose chat
// id starts with tag.
func (f *migrateFleet) useLaneNamed(tag string, p int) {
	for i := 0; ; i++ {
		chat := fmt.Sprintf("%s-%d", tag, i)
		src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chat, ChatType: session.ChatDM, UserID: "u"}
		key := session.BuildSessionKey(src, session.DefaultKeyOptions())
		lane := session.LaneToken(key)
		if session.Partition(f.names.Prefix(), lane) == p {
			f.chat, f.key, f.lane, f.p = chat, key, lane, p
			return
		}
	}
}

// connectSlow connects to srv through a relay that holds back what the
// server sends for d: every request waits at least d for its answer.
func connectSlow(t *testing.T, srv *natstest.Server, d time.Duration) *nats.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := strings.TrimPrefix(srv.URL(), "nats://")
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(s, c)
				_ = s.Close()
			}()
			go func() {
				defer wg.Done()
				defer func() { _ = c.Close() }()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						time.Sleep(d) // the delay the relay adds, not a wait for a condition
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	// Registered before the connection's own cleanup: runs after it.
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	nc, err := nats.Connect("nats://"+ln.Addr().String(), nats.Name(t.Name()+"-slow"), nats.Timeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestMigrateInboxMarkerRetriedOnNoResponders: the first drain marker's
// publish finds no stream taking the control subject (as while the
// stream's leader is away: no responders). The migration's retry makes
// the publish again, logging each failure as the stall it is (no response
// from stream), and the migration completes once the stream takes the
// subject again, which the test gives it back on that warning. (A client's
// own retry on no responders inside each attempt would hide it until the
// attempt's bound, and the warning would be a timeout.)
func TestMigrateInboxMarkerRetriedOnNoResponders(t *testing.T) {
	f := newMigrateFleet(t)
	first := f.post("first")
	f.waitCommitted(0, first.Sequence)
	name, ctl := f.names.InboxStreamAt(0), f.names.InboxControlSubject(0)
	setControl := func(on bool) {
		st, err := f.js.Stream(t.Context(), name)
		if err != nil {
			t.Error(err)
			return
		}
		cfg := st.CachedInfo().Config
		cfg.Subjects = slices.DeleteFunc(slices.Clone(cfg.Subjects), func(s string) bool { return s == ctl })
		if on {
			cfg.Subjects = append(cfg.Subjects, ctl)
		}
		if _, err := f.js.UpdateStream(t.Context(), cfg); err != nil {
			t.Error(err)
		}
	}
	removed, restored := false, false
	var warned []string
	o := admin.MigrateOptions{DrainTimeout: 30 * time.Second, RetryWait: 20 * time.Second}
	admin.SetMigrateAttemptTimeout(&o, 5*time.Second)
	admin.SetMigrateBeforeMark(&o, func(i int) {
		if i == 0 && !removed {
			removed = true
			setControl(false)
		}
	})
	// The warnings come from the migration's goroutine: here, the test's.
	o.Log = slog.New(&onWarn{msg: admin.MigrateRetrying, f: func(r slog.Record) {
		text := recordText(r)
		warned = append(warned, text)
		if removed && !restored && strings.Contains(text, "drain marker into "+name) &&
			strings.Contains(text, jetstream.ErrNoStreamResponse.Error()) {
			restored = true
			setControl(true)
		}
	}})
	if _, err := f.fl.MigrateInbox(t.Context(), 2, o); err != nil {
		t.Fatalf("migrate to 2: %v (warnings: %q)", err, warned)
	}
	if !restored {
		t.Fatalf("no warning of the marker's publish finding no stream; warnings: %q", warned)
	}
	f.checkMigratedTo(2)
	f.postAfterTheMove()
	if users := f.users(); !slices.Equal(users, []string{"first", "after"}) {
		t.Fatalf("user entries %q, want first, after", users)
	}
}

// TestMigrateInboxLeftMarkersPurged: a run stopped after it put drain
// markers into the streams and before it purged them (here: markers
// published on the streams' control subjects, as such a run did) leaves
// them there. The workers ignore them (the lane's next message is answered
// as usual), and the next run, at the fleet's count with nothing else to
// do, purges them, writing no map.
func TestMigrateInboxLeftMarkersPurged(t *testing.T) {
	f := newMigrateFleet(t)
	first := f.post("first")
	f.waitCommitted(0, first.Sequence)
	o := admin.MigrateOptions{DrainTimeout: 30 * time.Second}
	if _, err := f.fl.MigrateInbox(t.Context(), 2, o); err != nil {
		t.Fatal(err)
	}
	_, rev := checkMapSettled(t, f.js, f.names, 2)
	for i := range 2 {
		if n := f.markers(i); n != 0 {
			t.Fatalf("stream %d holds %d drain markers after the migration", i, n)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		_, err := f.js.Publish(ctx, f.names.InboxControlSubject(i), []byte("drain marker"), jetstream.WithExpectStream(f.names.InboxStreamAt(i)))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if n := f.markers(i); n != 1 {
			t.Fatalf("stream %d holds %d drain markers, want the one left", i, n)
		}
	}
	f.postAfterTheMove()

	rep, err := f.fl.MigrateInbox(t.Context(), 2, o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Moved != 0 || rep.Strays != 0 {
		t.Fatalf("the report %+v, want nothing moved or found", rep)
	}
	for i := range 2 {
		if n := f.markers(i); n != 0 {
			t.Fatalf("stream %d still holds %d drain markers after the next run", i, n)
		}
	}
	if _, rev2 := checkMapSettled(t, f.js, f.names, 2); rev2 != rev {
		t.Fatalf("the run wrote the map (revision %d to %d)", rev, rev2)
	}
	again := f.post("again")
	f.waitCommitted(1, again.Sequence)
	if users := f.users(); !slices.Equal(users, []string{"first", "after", "again"}) {
		t.Fatalf("user entries %q, want first, after, again", users)
	}
}

// TestMigrateInboxLeftMarkerSeenByItsSubject: the run at the fleet's count
// purges a stream's drain markers when its control subject holds one, and
// only then, whatever else the stream holds or takes meanwhile. Stream 1
// holds a marker a stopped run left while lanes keep posting into both
// streams; stream 0 holds no marker but a message on a subject an operator
// added to it. The run purges stream 1's markers, sends stream 0 no purge
// (its message stays), writes no map, and every lane's messages are
// answered once each, in order.
func TestMigrateInboxLeftMarkerSeenByItsSubject(t *testing.T) {
	f := newMigrateFleet(t)
	ctx := t.Context()
	o := admin.MigrateOptions{DrainTimeout: 30 * time.Second}
	if _, err := f.fl.MigrateInbox(ctx, 2, o); err != nil {
		t.Fatal(err)
	}
	_, rev := checkMapSettled(t, f.js, f.names, 2)
	other, name0 := f.names.Prefix()+".other", f.names.InboxStreamAt(0)
	st, err := f.js.Stream(ctx, name0)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.Subjects = append(cfg.Subjects, other)
	if _, err := f.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := f.js.Publish(pctx, other, []byte("not a marker"), jetstream.WithExpectStream(name0)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.Publish(pctx, f.names.InboxControlSubject(1), []byte("drain marker"), jetstream.WithExpectStream(f.names.InboxStreamAt(1))); err != nil {
		t.Fatal(err)
	}
	ps := startPosters(t, func() jetstream.JetStream { return natstest.JetStream(t, f.srv.Connect(t)) }, f.names, "left", 4)
	ps.waitPosted(t, 2)
	// The purge requests the server is sent.
	mon := f.srv.Connect(t)
	purges, err := mon.SubscribeSync("$JS.API.STREAM.PURGE.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := mon.Flush(); err != nil {
		t.Fatal(err)
	}

	rep, err := f.fl.MigrateInbox(ctx, 2, o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Moved != 0 || rep.Strays != 0 {
		t.Fatalf("the report %+v, want nothing moved or found", rep)
	}
	// The server routed each request to mon before it answered it: once
	// the flush is answered, mon holds them all.
	if err := mon.Flush(); err != nil {
		t.Fatal(err)
	}
	n, _, err := purges.Pending()
	if err != nil {
		t.Fatal(err)
	}
	var purged []string
	for range n {
		m, err := purges.NextMsg(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if s := strings.TrimPrefix(m.Subject, "$JS.API.STREAM.PURGE."); !slices.Contains(purged, s) {
			purged = append(purged, s)
		}
	}
	if !slices.Equal(purged, []string{f.names.InboxStreamAt(1)}) {
		t.Fatalf("purge requests to %q, want to %s alone", purged, f.names.InboxStreamAt(1))
	}
	if m := f.markers(1); m != 0 {
		t.Fatalf("stream 1 still holds %d drain markers", m)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(other))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Subjects[other] != 1 {
		t.Fatalf("stream 0 holds %d messages on %s, want 1", info.State.Subjects[other], other)
	}
	cfg.Subjects = slices.DeleteFunc(cfg.Subjects, func(s string) bool { return s == other })
	if _, err := f.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, rev2 := checkMapSettled(t, f.js, f.names, 2); rev2 != rev {
		t.Fatalf("the run wrote the map (revision %d to %d)", rev, rev2)
	}
	ps.waitPosted(t, 2)
	ps.stop(t)
	ps.checkTranscripts(t, f.fl)
}

// markers counts the messages on inbox stream i's control subject.
func (f *migrateFleet) markers(i int) uint64 {
	f.t.Helper()
	st, err := f.js.Stream(f.t.Context(), f.names.InboxStreamAt(i))
	if err != nil {
		f.t.Fatal(err)
	}
	info, err := st.Info(f.t.Context(), jetstream.WithSubjectFilter(f.names.InboxControlSubject(i)))
	if err != nil {
		f.t.Fatal(err)
	}
	return info.State.Subjects[f.names.InboxControlSubject(i)]
}
