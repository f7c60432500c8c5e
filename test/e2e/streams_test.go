package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/session"
)

// TestInboxStreamsMigration changes the number of inbox streams of a live
// fleet (three worker processes, the ingress process) under open-loop load
// with `fleetctl inbox streams 3` and then back with `fleetctl inbox streams
// 1`. Clients post with message ids and retry a failed post with the same id
// (as platforms do). At the end every lane's transcript holds exactly the
// messages its client had accepted, each once, in the order they were sent;
// each lane has one session; the workers consumers of every inbox stream are
// empty; and the fleet has the expected streams.
func TestInboxStreamsMigration(t *testing.T) {
	const lanes = 12
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	c := newCluster(t)
	c.startIngress()
	for _, id := range []string{"mig1", "mig2", "mig3"} {
		c.startWorker(id)
	}

	type sent struct {
		text string
	}
	type laneLoad struct {
		chat string
		// mu guards key and msgs while the load runs: the test reads them
		// before the load stops.
		mu   sync.Mutex
		key  string
		msgs []sent
		err  error
		// retried counts posts answered with an error and retried.
		retried int
	}
	sentCount := func(l *laneLoad) int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.msgs)
	}
	load := make([]*laneLoad, lanes)
	for i := range load {
		load[i] = &laneLoad{chat: fmt.Sprintf("mig-%02d", i)}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, l := range load {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				text := fmt.Sprintf("M%02d m%03d", i, n)
				if rng.IntN(100) < 30 {
					text += fmt.Sprintf("\n!sleep %dms", 50+rng.IntN(250))
				}
				id := fmt.Sprintf("%s-%d", l.chat, n)
				// A client retries with the same message id until accepted.
				deadline := time.Now().Add(60 * time.Second)
				for {
					a, err := c.tryPostCtx(ctx, l.chat, text, id)
					if err == nil {
						l.mu.Lock()
						if l.key == "" {
							l.key = a.SessionKey
						}
						l.mu.Unlock()
						break
					}
					if ctx.Err() != nil {
						return
					}
					if time.Now().After(deadline) {
						l.err = fmt.Errorf("%s: message %d not accepted within 60s: %v", l.chat, n, err)
						return
					}
					l.retried++
					pause := time.NewTimer(100 * time.Millisecond) // a client's retry pause
					select {
					case <-ctx.Done():
					case <-pause.C:
					}
					pause.Stop()
				}
				l.mu.Lock()
				l.msgs = append(l.msgs, sent{text: text})
				l.mu.Unlock()
				gap := time.NewTimer(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
				select {
				case <-stop:
					gap.Stop()
					return
				case <-gap.C:
				}
			}
		})
	}
	stopped := false
	stopLoad := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopLoad()

	// Every lane has had a turn before the first migration.
	waitFor(t, 60*time.Second, "every lane to have a turn", func() error {
		for _, l := range load {
			l.mu.Lock()
			key := l.key
			l.mu.Unlock()
			if key == "" {
				return fmt.Errorf("%s: nothing accepted yet", l.chat)
			}
			if e, err := c.entry(key); err != nil || e.LastTurnID == "" {
				return fmt.Errorf("%s: no turn yet", l.chat)
			}
		}
		return nil
	})

	migrate := func(n int) admin.MigrateReport {
		t.Helper()
		rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer rcancel()
		cmd := exec.CommandContext(rctx, fleetctlBinary, "inbox", "streams", "--json", fmt.Sprint(n))
		cmd.Env = append(baseEnv(), c.env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("fleetctl inbox streams %d: %v: %s", n, err, stderr.Bytes())
		}
		var rep admin.MigrateReport
		if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
			t.Fatalf("fleetctl inbox streams %d: %v: %s", n, err, stdout.Bytes())
		}
		t.Logf("inbox streams %d -> %d: %d partitions moved in %v, longest drain %v", rep.From, rep.To, rep.Moved, rep.Took, rep.Drain)
		return rep
	}
	// Partitions p with p mod 3 != 0 move: 42 of 64.
	if rep := migrate(3); rep.From != 1 || rep.To != 3 || rep.Moved != 42 {
		t.Fatalf("migration to 3 streams: %+v, want 1 -> 3, 42 moved", rep)
	}
	var show struct {
		Streams   int `json:"streams"`
		PerStream []struct {
			Name       string `json:"name"`
			Partitions []int  `json:"partitions"`
		} `json:"per_stream"`
	}
	if err := c.fleetctl(&show, "inbox", "show"); err != nil {
		t.Fatal(err)
	}
	if show.Streams != 3 || len(show.PerStream) != 3 || show.PerStream[1].Name != "FLEET_IN_1" || len(show.PerStream[0].Partitions) != 22 {
		t.Fatalf("inbox show after the migration: %+v", show)
	}
	// Load runs on the three streams for a while: every lane gets turns
	// there.
	marks := map[string]int{}
	for _, l := range load {
		marks[l.chat] = sentCount(l)
	}
	waitFor(t, 60*time.Second, "every lane to have messages accepted on three streams", func() error {
		for _, l := range load {
			if sentCount(l) < marks[l.chat]+3 {
				return fmt.Errorf("%s: %d messages since", l.chat, sentCount(l)-marks[l.chat])
			}
		}
		return nil
	})
	if rep := migrate(1); rep.From != 3 || rep.To != 1 || rep.Moved != 42 {
		t.Fatalf("migration back to 1 stream: %+v, want 3 -> 1, 42 moved", rep)
	}
	for _, l := range load {
		marks[l.chat] = sentCount(l)
	}
	waitFor(t, 60*time.Second, "every lane to have messages accepted after the way back", func() error {
		for _, l := range load {
			if sentCount(l) < marks[l.chat]+2 {
				return fmt.Errorf("%s: %d messages since", l.chat, sentCount(l)-marks[l.chat])
			}
		}
		return nil
	})
	stopLoad()

	retried := 0
	for _, l := range load {
		if l.err != nil {
			t.Error(l.err)
		}
		retried += l.retried
	}
	t.Logf("%d posts retried by clients", retried)
	if t.Failed() {
		return
	}
	// Every accepted message in its lane's transcript, once, in order.
	for _, l := range load {
		want := make([]string, len(l.msgs))
		for i, m := range l.msgs {
			want[i] = m.text
		}
		err := poll(90*time.Second, func() error {
			e, err := c.entry(l.key)
			if err != nil {
				return err
			}
			if e.Turn != nil {
				return fmt.Errorf("turn %s in flight", e.Turn.ID)
			}
			var got []string
			for _, u := range userEntries(c.load(e.SessionID)) {
				got = append(got, u.Content)
			}
			if len(got) < len(want) {
				return fmt.Errorf("%d of %d messages in the transcript", len(got), len(want))
			}
			if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
				return fatalf("%s: transcript user entries\n%q\nwant (accepted, in order, once each)\n%q", l.chat, got, want)
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s: %v", l.chat, err)
			dumpLane(t, c, l.key)
			continue
		}
		if evs := c.laneTurnEvents(session.LaneToken(l.key)); len(evs) > 0 {
			sids := map[string]bool{}
			for _, ev := range evs {
				sids[ev.SessionID] = true
			}
			if len(sids) != 1 {
				t.Errorf("%s: turns ran in %d sessions", l.chat, len(sids))
			}
		}
	}
	// Nothing left for the workers in any stream, and the fleet is back to
	// one stream.
	ictx, icancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer icancel()
	if err := c.res.Inboxes.Refresh(ictx); err != nil {
		t.Fatal(err)
	}
	if n := len(c.res.Inboxes.All()); n != 1 {
		t.Fatalf("%d inbox streams after the way back, want 1", n)
	}
	for _, name := range []string{"FLEET_IN_1", "FLEET_IN_2"} {
		if _, err := c.js.Stream(ictx, name); err == nil {
			t.Errorf("stream %s still exists after the way back to one stream", name)
		}
	}
	waitFor(t, 60*time.Second, "the workers consumer to settle", c.inboxSettled)
}

// dumpLane logs what the fleet knows of a lane: its entry, and its messages
// in every inbox stream.
func dumpLane(t *testing.T, c *cluster, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lane := session.LaneToken(key)
	p := session.Partition(c.names.Prefix(), lane)
	e, _ := c.entry(key)
	if e != nil {
		t.Logf("%s (partition %d): inbox_id %s committed_seq %d owner %q turn %v", lane, p, e.InboxID, e.CommittedSeq, e.Owner, e.Turn)
	}
	_ = c.res.Inboxes.Refresh(ctx)
	m, rev := c.res.Inboxes.Map()
	t.Logf("inbox map rev %d: %s, partition %d in stream %d", rev, m, p, m.Assign[p])
	for _, in := range c.res.Inboxes.All() {
		subject := c.names.InboxSubject(p, lane)
		for seq := uint64(1); ; {
			raw, err := in.Stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
			if err != nil {
				break
			}
			t.Logf("  %s (id %s) seq %d: %s", in.Name, in.ID, raw.Sequence, raw.Data)
			seq = raw.Sequence + 1
		}
		if cons, err := in.Stream.Consumer(ctx, c.names.WorkersConsumer()); err == nil {
			if info, err := cons.Info(ctx); err == nil {
				t.Logf("  %s workers: %d pending, %d ack pending, %d redelivered", in.Name, info.NumPending, info.NumAckPending, info.NumRedelivered)
			}
		}
	}
}
