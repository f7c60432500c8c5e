//go:build compose

package compose

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

// msg is one message of the chaos run.
type msg struct {
	idx      int
	id       string // the platform message id (httpMsgID of chat and message_id)
	text     string
	ingress  int
	seq      uint64
	firstTry time.Time // first POST attempt
	accepted time.Time // 202
	replied  time.Time // first reply that incorporates it, seen through an ingress (guarded by lane.mu)
	retries  int
}

// lane is one conversation of the chaos run.
type lane struct {
	n    int
	chat string
	key  string
	mu   sync.Mutex
	msgs []*msg
}

// fault is one injected fault with its window (from the injection until
// the system was whole again).
type fault struct {
	name       string
	target     string
	start, end time.Time
	// victimOwner is the worker incarnation a worker fault hit; lanes are
	// the lanes it owned at that moment.
	victimOwner string
	lanes       []string
	detail      []string
}

var lineRe = regexp.MustCompile(`^L(\d{3}) m(\d{5})$`)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// chaos drives load through both ingresses while it kills a worker, kills
// the NATS node leading the inbox stream, partitions a NATS node and heals
// it, restarts every worker in turn and partitions a worker from NATS.
// Then it checks DESIGN §3 over every message and reports the figures.
func chaos(t *testing.T, s *stack) {
	total := envInt("COMPOSE_MESSAGES", 2000)
	nLanes := envInt("COMPOSE_LANES", 40)
	// The load is paced (COMPOSE_RATE messages a second, 10 by default:
	// what the one-at-a-time reply delivery of a sync-always R3 cluster
	// keeps up with on a busy 2-core machine). The fault schedule repeats
	// until total messages are posted, at least once.
	rate := float64(envInt("COMPOSE_RATE", 10))
	interval := time.Duration(float64(nLanes) / rate * float64(time.Second))
	seed := uint64(time.Now().UnixNano())
	t.Logf("chaos: at least %d messages over %d lanes, one every %v per lane (%.0f/s); seed %d", total, nLanes, interval, rate, seed)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lanes := make([]*lane, nLanes)
	var posted sync.WaitGroup
	var faultsDone = make(chan struct{})
	var count struct {
		sync.Mutex
		n int
	}
	errs := make(chan error, nLanes*2)
	begin := time.Now()
	for i := range lanes {
		l := &lane{n: i, chat: fmt.Sprintf("chaos-%03d", i)}
		lanes[i] = l
		posted.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			next := begin.Add(time.Duration(rng.Int64N(int64(interval))))
			for m := 0; ; m++ {
				count.Lock()
				enough := count.n >= total
				count.Unlock()
				select {
				case <-faultsDone:
					if enough {
						return
					}
				default:
				}
				if d := time.Until(next); d > 0 {
					tm := time.NewTimer(d)
					select {
					case <-ctx.Done():
						tm.Stop()
						return
					case <-tm.C:
					}
				}
				next = next.Add(interval/2 + time.Duration(rng.Int64N(int64(interval))))
				text := fmt.Sprintf("L%03d m%05d", i, m)
				if rng.IntN(100) < 25 {
					// Some turns take a while, so faults catch them in flight.
					text += fmt.Sprintf("\n!sleep %dms", 200+rng.IntN(800))
				}
				x := &msg{idx: m, text: text, ingress: (i + m) % 2, firstTry: time.Now()}
				id := fmt.Sprintf("chaos-%d-%d", i, m)
				// A refused or failed POST is retried with the same message
				// id, through the other ingress too, as a platform would.
				var a acceptResp
				err := poll(3*time.Minute, func() error {
					var err error
					a, err = s.post(ctx, s.ingress[x.ingress], l.chat, text, id)
					if err != nil && ctx.Err() == nil {
						x.retries++
						x.ingress = 1 - x.ingress
					}
					return err
				})
				if err != nil {
					errs <- fmt.Errorf("%s: message %d never accepted: %w", l.chat, m, err)
					cancel()
					return
				}
				x.id, x.seq, x.accepted = httpMsgID(l.chat, id), a.Seq, time.Now()
				l.mu.Lock()
				if l.key == "" {
					l.key = a.SessionKey
				}
				l.msgs = append(l.msgs, x)
				l.mu.Unlock()
				count.Lock()
				count.n++
				count.Unlock()
			}
		})
	}
	// Reply readers: one long poll per lane, through the ingress the lane's
	// number picks; a reply marks every message whose line it echoes.
	var readers sync.WaitGroup
	readCtx, stopReaders := context.WithCancel(ctx)
	defer stopReaders()
	for _, l := range lanes {
		readers.Go(func() { readReplies(readCtx, s, l) })
	}

	// The faults.
	var faults []*fault
	pause := func(d time.Duration) {
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-ctx.Done():
		case <-tm.C:
		}
	}
	posting := func() bool {
		count.Lock()
		defer count.Unlock()
		return count.n < total && ctx.Err() == nil
	}
	runFaults := func() {
		defer close(faultsDone)
		pause(20 * time.Second) // the baseline
		for round := 1; round == 1 || posting(); round++ {
			t.Logf("fault round %d", round)
			faultRound(t, s, pause, &faults)
		}
	}
	runFaults()
	posted.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	var all []*msg
	for _, l := range lanes {
		all = append(all, l.msgs...)
	}
	t.Logf("posted %d messages to %d lanes in %v; %d faults", len(all), nLanes, time.Since(begin).Round(time.Second), len(faults))
	if ctx.Err() != nil {
		t.Fatal("the run was cancelled")
	}

	// Quiescence: every lane committed its last message, no turn in
	// flight, every delivery settled.
	settle := time.Now()
	waitFor(t, 10*time.Minute, "every lane to commit its last message and every reply to be delivered", func() error {
		for _, l := range lanes {
			if len(l.msgs) == 0 {
				continue
			}
			if err := s.committed(l.key, l.msgs[len(l.msgs)-1].seq); err != nil {
				return err
			}
		}
		if err := s.delivered(); err != nil {
			return err
		}
		return s.inboxSettled()
	})
	t.Logf("settled %v after the last post", time.Since(settle).Round(100*time.Millisecond))
	// Let the readers see the last replies (a lane's last message always
	// gets one: no later message interrupts its turn), then stop them.
	// Earlier messages may have none: a message that arrives while a turn
	// runs interrupts it (busy mode interrupt), and the interrupted turn
	// ends without a reply.
	unanswered := func() []*lane {
		var out []*lane
		for _, l := range lanes {
			l.mu.Lock()
			if n := len(l.msgs); n > 0 && l.msgs[n-1].replied.IsZero() {
				out = append(out, l)
			}
			l.mu.Unlock()
		}
		return out
	}
	if err := poll(2*time.Minute, func() error {
		if u := unanswered(); len(u) > 0 {
			return fmt.Errorf("%s m%d: no reply seen (and %d more lanes)", u[0].chat, u[0].msgs[len(u[0].msgs)-1].idx, len(u)-1)
		}
		return nil
	}); err != nil {
		// Say what became of each unanswered message, then run the
		// invariant checks all the same: they tell a lost message from a
		// dead-lettered one.
		t.Errorf("timed out after 2m0s waiting for the reply to every lane's last message through the ingresses: %v", err)
		for _, l := range unanswered() {
			diagnoseUnanswered(t, s, l)
		}
	}
	stopReaders()
	readers.Wait()

	st := checkInvariants(t, s, lanes)
	report(t, s, lanes, faults, st)
}

// diagnoseUnanswered logs what became of a lane's last message that got no
// reply: the lane's entry, every inbox copy of the message, and the turn
// events and turn_end statuses of the turns whose range covers a copy.
func diagnoseUnanswered(t *testing.T, s *stack, l *lane) {
	t.Helper()
	m := l.msgs[len(l.msgs)-1]
	lt := session.LaneToken(l.key)
	if e, err := s.entry(l.key); err != nil {
		t.Logf("%s m%d unanswered: entry: %v", l.chat, m.idx, err)
	} else {
		t.Logf("%s m%d unanswered (accepted as seq %d): entry owner %q epoch %d committed %d turn %v session %s suspended %v interrupted_turns %d",
			l.chat, m.idx, m.seq, e.Owner, e.LeaseEpoch, e.CommittedSeq, e.Turn != nil, e.SessionID, e.Suspended, e.InterruptedTurns)
	}
	inbox, err := s.readStream(s.res.Inbox, s.names.InboxSubject(session.Partition(s.names.Prefix(), lt), lt))
	if err != nil {
		t.Logf("%s: read the lane's inbox: %v", l.chat, err)
	}
	var copies []uint64
	for _, x := range inbox {
		var in session.Inbound
		if json.Unmarshal(x.Data, &in) == nil && in.PlatformMsgID == m.id {
			copies = append(copies, x.Sequence)
			t.Logf("%s m%d: inbox copy at seq %d stored %s", l.chat, m.idx, x.Sequence, x.Time.Format(time.StampMilli))
		}
	}
	evs, err := s.readStream(s.res.Events, s.names.EventSubject("turn", lt))
	if err != nil {
		t.Logf("%s: read the lane's turn events: %v", l.chat, err)
	}
	for _, x := range evs {
		var ev worker.TurnEvent
		if json.Unmarshal(x.Data, &ev) != nil {
			continue
		}
		for _, c := range copies {
			if ev.FirstSeq <= c && c <= ev.LastSeq {
				t.Logf("%s m%d: turn %s %s seqs %d..%d attempt %d owner %s epoch %d status %q at %s",
					l.chat, m.idx, ev.TurnID, ev.Type, ev.FirstSeq, ev.LastSeq, ev.Attempt, ev.Owner, ev.Epoch, ev.Status, ev.At.Format(time.StampMilli))
				break
			}
		}
	}
	for _, typ := range []string{"duplicate", "deadletter", "resume"} {
		xs, err := s.readStream(s.res.Events, s.names.EventSubject(typ, lt))
		if err != nil {
			continue
		}
		for _, x := range xs {
			t.Logf("%s: %s event at %s: %s", l.chat, typ, x.Time.Format(time.StampMilli), x.Data)
		}
	}
}

// faultRound injects each fault once, with pauses between them.
func faultRound(t *testing.T, s *stack, pause func(time.Duration), faults *[]*fault) {
	*faults = append(*faults, killWorker(t, s))
	pause(15 * time.Second)
	*faults = append(*faults, killInboxLeader(t, s))
	pause(15 * time.Second)
	*faults = append(*faults, partitionNATSNode(t, s))
	pause(15 * time.Second)
	*faults = append(*faults, rollingRestart(t, s)...)
	pause(15 * time.Second)
	*faults = append(*faults, partitionWorker(t, s))
	pause(10 * time.Second)
}

// readReplies long-polls a lane's mailbox and stamps each message with the
// moment its reply was first seen.
func readReplies(ctx context.Context, s *stack, l *lane) {
	var after uint64
	base := s.ingress[l.n%2]
	for ctx.Err() == nil {
		l.mu.Lock()
		key := l.key
		l.mu.Unlock()
		if key == "" {
			tm := time.NewTimer(200 * time.Millisecond)
			select {
			case <-ctx.Done():
				tm.Stop()
				return
			case <-tm.C:
			}
			continue
		}
		page, err := s.replies(ctx, base, key, after, 10*time.Second)
		if err != nil {
			// The ingress lost its NATS node, or is partitioned: try the
			// other one.
			base = s.ingress[(l.n+1)%2]
			tm := time.NewTimer(200 * time.Millisecond)
			select {
			case <-ctx.Done():
				tm.Stop()
				return
			case <-tm.C:
			}
			continue
		}
		now := time.Now()
		for _, r := range page {
			after = max(after, r.Seq)
			if r.Kind != session.ReplyKindReply {
				continue
			}
			for _, line := range strings.Split(strings.TrimPrefix(r.Text, "echo: "), "\n") {
				m := lineRe.FindStringSubmatch(line)
				if m == nil {
					continue
				}
				idx, _ := strconv.Atoi(m[2])
				l.mu.Lock()
				for _, x := range l.msgs {
					if x.idx == idx && x.replied.IsZero() {
						x.replied = now
					}
				}
				l.mu.Unlock()
			}
		}
	}
}

// ownedBy lists the lanes whose entry names owner.
func ownedBy(s *stack, owner string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lister, err := s.res.Sessions.ListKeys(ctx)
	if err != nil {
		return nil
	}
	var out []string
	for lane := range lister.Keys() {
		e, _, err := s.store.Get(ctx, lane)
		if err == nil && e.Owner == owner {
			out = append(out, lane)
		}
	}
	return out
}

// turnsInFlight counts, per worker incarnation, the lanes whose entry
// records a running turn of it.
func turnsInFlight(s *stack) map[string]int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := map[string]int{}
	lister, err := s.res.Sessions.ListKeys(ctx)
	if err != nil {
		return out
	}
	for lane := range lister.Keys() {
		if e, _, err := s.store.Get(ctx, lane); err == nil && e.Turn != nil && e.Owner != "" {
			out[e.Owner]++
		}
	}
	return out
}

// pickWorker returns the worker service to hit: for up to 10 s, it waits
// for a moment when some worker runs turns and picks the one running the
// most (so the fault interrupts work); failing that, the one owning the
// most lanes. It returns the worker's incarnation and the lanes it owns.
func pickWorker(t *testing.T, s *stack) (svc, owner string, lanes []string) {
	owners := map[string]string{}
	for i, w := range workerServices {
		owners[w] = s.workerOwner(fmt.Sprintf("w%d", i+1))
	}
	_ = poll(10*time.Second, func() error {
		running := turnsInFlight(s)
		best := 0
		for _, w := range workerServices {
			if n := running[owners[w]]; n > best {
				svc, best = w, n
			}
		}
		if best == 0 {
			return errors.New("no turn in flight")
		}
		return nil
	})
	if svc != "" {
		return svc, owners[svc], ownedBy(s, owners[svc])
	}
	for _, w := range workerServices {
		l := ownedBy(s, owners[w])
		if svc == "" || len(l) > len(lanes) {
			svc, owner, lanes = w, owners[w], l
		}
	}
	return svc, owner, lanes
}

func killWorker(t *testing.T, s *stack) *fault {
	svc, owner, lanes := pickWorker(t, s)
	f := &fault{name: "kill -9 a worker", target: svc, victimOwner: owner, lanes: lanes, start: time.Now()}
	s.kill(svc)
	t.Logf("killed %s (%s) owning %d lanes", svc, owner, len(lanes))
	pause := time.NewTimer(3 * time.Second)
	<-pause.C
	s.start(svc)
	took := s.waitServiceHealthy(svc, healthyTimeout)
	f.end = time.Now()
	f.detail = append(f.detail, fmt.Sprintf("restarted after 3 s, healthy %v later", took.Round(100*time.Millisecond)))
	return f
}

func killInboxLeader(t *testing.T, s *stack) *fault {
	var svc string
	waitFor(t, time.Minute, "the inbox stream's leader", func() (err error) { svc, err = s.inboxLeader(); return err })
	f := &fault{name: "kill -9 the NATS node leading the inbox", target: svc, start: time.Now()}
	s.kill(svc)
	var next string
	waitFor(t, 2*time.Minute, "a new inbox leader", func() error {
		l, err := s.inboxLeader()
		if err != nil {
			return err
		}
		if l == svc {
			return fmt.Errorf("still %s", l)
		}
		next = l
		return nil
	})
	elected := time.Since(f.start)
	t.Logf("killed %s (inbox leader); %s leads after %v", svc, next, elected.Round(10*time.Millisecond))
	pause := time.NewTimer(5 * time.Second)
	<-pause.C
	s.start(svc)
	took := s.waitServiceHealthy(svc, healthyTimeout)
	caught := s.waitReplicasCurrent(healthyTimeout)
	f.end = time.Now()
	f.detail = append(f.detail, fmt.Sprintf("new inbox leader %s after %v", next, elected.Round(10*time.Millisecond)),
		fmt.Sprintf("node restarted after 5 s, healthy %v later, every replica current %v after that", took.Round(100*time.Millisecond), caught.Round(100*time.Millisecond)))
	return f
}

func partitionNATSNode(t *testing.T, s *stack) *fault {
	var svc string
	waitFor(t, time.Minute, "the inbox stream's leader", func() (err error) { svc, err = s.inboxLeader(); return err })
	f := &fault{name: "partition the inbox leader's NATS node", target: svc, start: time.Now()}
	s.disconnect(svc)
	var next string
	waitFor(t, 2*time.Minute, "a new inbox leader on the majority side", func() error {
		l, err := s.inboxLeader()
		if err != nil {
			return err
		}
		if l == svc {
			return fmt.Errorf("still %s", l)
		}
		next = l
		return nil
	})
	elected := time.Since(f.start)
	t.Logf("partitioned %s; %s leads the inbox after %v", svc, next, elected.Round(10*time.Millisecond))
	hold := time.NewTimer(15 * time.Second)
	<-hold.C
	s.connectNet(svc)
	took := s.waitServiceHealthy(svc, healthyTimeout)
	caught := s.waitReplicasCurrent(healthyTimeout)
	f.end = time.Now()
	f.detail = append(f.detail, fmt.Sprintf("new inbox leader %s after %v", next, elected.Round(10*time.Millisecond)),
		fmt.Sprintf("healed after 15 s, healthy %v later, every replica current %v after that", took.Round(100*time.Millisecond), caught.Round(100*time.Millisecond)))
	return f
}

func rollingRestart(t *testing.T, s *stack) []*fault {
	var out []*fault
	for i, svc := range workerServices {
		owner := s.workerOwner(fmt.Sprintf("w%d", i+1))
		f := &fault{name: "rolling restart (SIGTERM, drain, start)", target: svc, victimOwner: owner, lanes: ownedBy(s, owner), start: time.Now()}
		s.stop(svc, 30*time.Second)
		drained := time.Since(f.start)
		s.start(svc)
		took := s.waitServiceHealthy(svc, healthyTimeout)
		f.end = time.Now()
		f.detail = append(f.detail, fmt.Sprintf("stopped (drained) in %v, healthy %v after the start", drained.Round(100*time.Millisecond), took.Round(100*time.Millisecond)))
		t.Logf("restarted %s: %s", svc, f.detail[0])
		out = append(out, f)
		pause := time.NewTimer(5 * time.Second)
		<-pause.C
	}
	return out
}

func partitionWorker(t *testing.T, s *stack) *fault {
	svc, owner, lanes := pickWorker(t, s)
	f := &fault{name: "partition a worker from NATS", target: svc, victimOwner: owner, lanes: lanes, start: time.Now()}
	s.disconnect(svc)
	t.Logf("partitioned %s (%s) owning %d lanes", svc, owner, len(lanes))
	// Its leases expire on the server; the others take its lanes over.
	waitFor(t, 2*time.Minute, "the partitioned worker's lanes to be taken over", func() error {
		var still []string
		for _, lane := range lanes {
			if e, err := s.entryByLane(lane); err == nil && e.Owner == owner {
				still = append(still, lane)
			}
		}
		if len(still) > 0 {
			return fmt.Errorf("%d lanes still name %s, e.g. %s", len(still), owner, still[0])
		}
		return nil
	})
	f.detail = append(f.detail, fmt.Sprintf("all %d lanes taken over %v after the cut", len(lanes), time.Since(f.start).Round(100*time.Millisecond)))
	hold := time.NewTimer(5 * time.Second)
	<-hold.C
	healed := time.Now()
	s.connectNet(svc)
	took := s.waitServiceHealthy(svc, healthyTimeout)
	f.end = time.Now()
	f.detail = append(f.detail, fmt.Sprintf("healed after %v, healthy %v later", healed.Sub(f.start).Round(100*time.Millisecond), took.Round(100*time.Millisecond)))
	f.detail = append(f.detail, fmt.Sprintf("its log says \"lease lost\" %d times", strings.Count(s.logs(svc, f.start), "lease lost")))
	return f
}

// echoText is the echo agent's reply to a turn of these messages.
func echoText(texts []string) string {
	var kept []string
	for _, m := range texts {
		var lines []string
		for _, line := range strings.Split(m, "\n") {
			if !strings.HasPrefix(strings.TrimSpace(line), "!") {
				lines = append(lines, line)
			}
		}
		if len(lines) > 0 {
			kept = append(kept, strings.Join(lines, "\n"))
		}
	}
	return "echo: " + strings.Join(kept, "\n")
}

func sortedDurations(d []time.Duration) []time.Duration {
	out := slices.Clone(d)
	slices.Sort(out)
	return out
}
