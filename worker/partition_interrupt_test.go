package worker_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

// startPartitionable runs a worker in the default busy mode (interrupt)
// whose NATS connection goes through url, with the fleet's ping settings
// scaled down so a silent partition is noticed within seconds (as the
// compose cluster's processes notice one).
func (f *fleet) startPartitionable(id, url string) *worker.Worker {
	f.t.Helper()
	nc, err := nats.Connect(url, nats.Name(id), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.IgnoreDiscoveredServers(), nats.RetryOnFailedConnect(true),
		nats.PingInterval(500*time.Millisecond), nats.MaxPingsOutstanding(3), nats.ReconnectBufSize(64<<20))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(nc.Close)
	js := natstest.JetStream(f.t, nc)
	res, err := broker.Provision(f.t.Context(), js, broker.ProvisionConfig{Names: f.names, LeaseTTL: testTTL})
	if err != nil {
		f.t.Fatal(err)
	}
	cfg := worker.Config{ID: id, Names: f.names, Backend: echo.Backend(echo.Options{}), LeaseTTL: testTTL,
		LeaseMargin: 500 * time.Millisecond, Linger: 500 * time.Millisecond, PeekInterval: 100 * time.Millisecond,
		DrainTimeout: 2 * time.Second}
	w, err := worker.New(nc, js, res, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	f.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				f.t.Errorf("worker %s: %v", id, err)
			}
		case <-time.After(30 * time.Second):
			f.t.Errorf("worker %s did not stop", id)
		}
	})
	return w
}

// TestPartitionedWorkerInterruptMode is the compose chaos run's worker
// partition in small: three workers in busy mode interrupt, paced load on
// several lanes (a quarter of the turns sleep, so the cut catches turns in
// flight), and the worker holding lanes partitioned from NATS without its
// connection closing (packets held), until every lane it owned is taken
// over, then healed, three times. Every lane's last message must get a
// reply, and every message must be in its lane's transcript exactly once,
// in order.
func TestPartitionedWorkerInterruptMode(t *testing.T) {
	if testing.Short() {
		t.Skip("slow (partitions a worker three times under load); skipped under -short")
	}
	f := newFleet(t)
	p := newTCPProxy(t, f.srv.URL())
	cut := f.startPartitionable("cut", p.URL())
	f.startWorker("alive1", nil)
	f.startWorker("alive2", nil)

	const lanes = 8
	type laneState struct {
		mu   sync.Mutex
		lane string
		sent []string
	}
	states := make([]*laneState, lanes)
	for i := range states {
		states[i] = &laneState{}
	}
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for i := range lanes {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			chat := fmt.Sprintf("pi-%d", i)
			for n := 0; ctx.Err() == nil; n++ {
				text := fmt.Sprintf("L%d m%04d", i, n)
				body := text
				if rng.IntN(100) < 25 {
					body += fmt.Sprintf("\n!sleep %dms", 200+rng.IntN(800))
				}
				lane, _ := f.post(chat, body, fmt.Sprintf("%s-%d", chat, n))
				st := states[i]
				st.mu.Lock()
				st.lane = lane
				st.sent = append(st.sent, text)
				st.mu.Unlock()
				tm := time.NewTimer(time.Duration(200+rng.IntN(600)) * time.Millisecond)
				select {
				case <-ctx.Done():
				case <-tm.C:
				}
				tm.Stop()
			}
		})
	}
	pause := func(d time.Duration) {
		tm := time.NewTimer(d)
		defer tm.Stop()
		<-tm.C
	}
	for round := range 3 {
		pause(3 * time.Second)
		// Cut the worker while it owns lanes, preferably with turns in
		// flight.
		var owned []string
		natstest.WaitFor(t, 60*time.Second, "the worker to be cut to own lanes", func() error {
			owned = owned[:0]
			for _, st := range states {
				st.mu.Lock()
				lane := st.lane
				st.mu.Unlock()
				if lane == "" {
					continue
				}
				if e, _, err := f.store.Get(t.Context(), lane); err == nil && e.Owner == cut.Owner() {
					owned = append(owned, lane)
				}
			}
			if len(owned) == 0 {
				return errors.New("owns none")
			}
			return nil
		})
		p.Pause()
		t.Logf("round %d: cut the worker owning %d lanes", round, len(owned))
		natstest.WaitFor(t, 60*time.Second, "the cut worker's lanes to be taken over", func() error {
			for _, lane := range owned {
				if e, _, err := f.store.Get(t.Context(), lane); err == nil && e.Owner == cut.Owner() {
					return fmt.Errorf("%s still names the cut worker", lane)
				}
			}
			return nil
		})
		pause(2 * time.Second)
		p.Resume()
	}
	pause(3 * time.Second)
	stop()
	wg.Wait()

	for _, st := range states {
		last := st.sent[len(st.sent)-1]
		natstest.WaitFor(t, 120*time.Second, fmt.Sprintf("the reply to %q on %s", last, st.lane), func() error {
			for _, r := range f.replies(st.lane) {
				for _, line := range strings.Split(strings.TrimPrefix(r.Text, "echo: "), "\n") {
					if line == last {
						return nil
					}
				}
			}
			e, _, _ := f.store.Get(t.Context(), st.lane)
			return fmt.Errorf("no reply yet; entry %+v", e)
		})
	}
	for _, st := range states {
		e, _, err := f.store.Get(t.Context(), st.lane)
		if err != nil {
			t.Fatal(err)
		}
		entries, _, err := f.tx.Load(t.Context(), e.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, en := range entries {
			if en.Role == transcript.RoleUser && en.Kind == transcript.KindMessage {
				got = append(got, strings.SplitN(en.Content, "\n", 2)[0])
			}
		}
		if strings.Join(got, "|") != strings.Join(st.sent, "|") {
			t.Errorf("lane %s: transcript user entries\n%q\nwant\n%q", st.lane, got, st.sent)
		}
	}
}

// A second inbox copy of a platform message (a NATS failover can store a
// retried publish twice) does not interrupt a running turn in busy mode
// interrupt: the copy is a duplicate and never runs, so an interrupt would
// leave the running turn's message without an answer. Here a copy of the
// running turn's own message, and a copy of an earlier one, each arrive
// while a turn runs: every message is answered, once.
func TestDuplicateCopyDoesNotInterrupt(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", noReset)

	lane, s := f.post("dupi", "slow\n!sleep 1500ms", "m1")
	f.waitTurn(lane, s)
	f.settled(lane, f.postCopy("dupi", "slow\n!sleep 1500ms", "m1"))
	if got := texts(f.replies(lane), session.ReplyKindReply); !slices.Equal(got, []string{"echo: slow"}) {
		t.Fatalf("replies %q: want the running turn answered despite the copy of its message", got)
	}

	_, s = f.post("dupi", "two\n!sleep 1500ms", "m2")
	f.waitTurn(lane, s)
	f.settled(lane, f.postCopy("dupi", "slow\n!sleep 1500ms", "m1"))
	if got := texts(f.replies(lane), session.ReplyKindReply); !slices.Equal(got, []string{"echo: slow", "echo: two"}) {
		t.Fatalf("replies %q: want \"two\" answered despite a copy of an earlier message", got)
	}

	// A copy of a /stop that already ran does not stop a later turn.
	_, s = f.post("dupi", "/stop", "s1")
	f.settled(lane, s)
	_, s = f.post("dupi", "five\n!sleep 1500ms", "m5")
	f.waitTurn(lane, s)
	f.settled(lane, f.postCopy("dupi", "/stop", "s1"))
	if got := texts(f.replies(lane), session.ReplyKindReply); !slices.Equal(got, []string{"echo: slow", "echo: two", "echo: five"}) {
		t.Fatalf("replies %q: want \"five\" answered despite a copy of an earlier /stop", got)
	}

	// A real message still interrupts (the interrupted turn is answered
	// by nothing; the next one answers the new message).
	_, s = f.post("dupi", "three\n!sleep 3s", "m3")
	f.waitTurn(lane, s)
	_, s = f.post("dupi", "four", "m4")
	f.settled(lane, s)
	if got := texts(f.replies(lane), session.ReplyKindReply); !slices.Equal(got, []string{"echo: slow", "echo: two", "echo: five", "echo: four"}) {
		t.Fatalf("replies %q: want \"three\" interrupted by \"four\"", got)
	}
}
