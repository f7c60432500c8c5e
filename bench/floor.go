package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// floorOpTimeout bounds the operations of one floor turn, like the fleet's
// write timeouts.
const floorOpTimeout = 5 * time.Second

// Floor measures the raw JetStream operations of one turn, with the fleet's
// streams, buckets and consumer (broker.Provision), payload sizes, lane
// count, consumer loops and in-process connections, and no agentfleet code
// in between. A turn is:
//
//	client:  publish the inbound message with a Msg-Id (accepted at its PubAck)
//	server:  deliver it from the shared durable pull consumer "workers"
//	lane:    KV get + KV CAS of the session entry (the intent)
//	         append the user entry, then the assistant entry (expect-last-subject-seq, Msg-Id)
//	         publish the reply to the outbox with a Msg-Id   <- the reply arrives here
//	         append the turn_end entry
//	         KV CAS of the session entry (the commit)
//	         ack the delivery
//
// The order is the one worker/turn.go issues them in (the reply is published
// before the turn_end entry). Each lane's operations go, one at a time,
// through the connection of the consumer loop the lane belongs to, as a
// lane's do through its owner's.
func Floor(ctx context.Context, opts Options) (Result, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return Result{}, err
	}
	e, err := startEnv(o, "floor", false)
	if err != nil {
		return Result{}, err
	}
	defer e.close()
	if o.NATSURL != "" {
		// A fleet of its own on the running server, removed afterwards.
		e.names = broker.MustNames("benchfloor" + o.RunID)
	}
	names := e.names

	_, cjs, err := e.connect("bench-floor-client", false)
	if err != nil {
		return Result{}, err
	}
	if o.NATSURL != "" {
		e.cleanups = append(e.cleanups, func() { e.dropFleet(cjs) })
	}
	cres, err := e.provision(ctx, cjs)
	if err != nil {
		return Result{}, err
	}

	ids := make([]laneID, o.Lanes)
	subjects := make([]string, o.Lanes)
	byInbox := make(map[string]int, o.Lanes)
	for i := range ids {
		ids[i] = newLaneID(names, o.RunID, i)
		subjects[i] = ids[i].outbox
		byInbox[ids[i].inbox] = i
	}
	d := newDriver(o, "floor", subjects)
	onc, _, err := e.connect("bench-floor-observer", true)
	if err != nil {
		return Result{}, err
	}
	if err := d.observe(onc, names.OutboxWildcard()); err != nil {
		return Result{}, err
	}
	var tp *tap
	if o.CountOps {
		tnc, _, err := e.connect("bench-floor-tap", true)
		if err != nil {
			return Result{}, err
		}
		if tp, err = startTap(tnc, names); err != nil {
			return Result{}, err
		}
	}

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	// The consumer loops, each on its own connection, and the lanes.
	type loop struct {
		js  jetstream.JetStream
		res *broker.Resources
		it  jetstream.MessagesContext
	}
	loops := make([]*loop, o.Workers)
	for w := range loops {
		_, js, err := e.connect(fmt.Sprintf("bench-floor-worker-%d", w+1), false)
		if err != nil {
			return Result{}, err
		}
		res, err := e.provision(ctx, js)
		if err != nil {
			return Result{}, err
		}
		loops[w] = &loop{js: js, res: res}
	}
	lanes := make([]*floorLane, o.Lanes)
	var laneWG, loopWG sync.WaitGroup
	var stopOnce sync.Once
	stopLoops := func() {
		stopOnce.Do(func() {
			for _, lp := range loops {
				if lp.it != nil {
					lp.it.Stop()
				}
			}
			loopWG.Wait()
			for _, l := range lanes {
				if l != nil {
					close(l.in)
				}
			}
			laneWG.Wait()
		})
	}
	defer stopLoops()
	for i := range lanes {
		lp := loops[i%len(loops)]
		l := &floorLane{
			id: ids[i], idx: i, js: lp.js, sessions: lp.res.Sessions, names: names,
			p: newFloorPayloads(ids[i], i, o.TextSize), in: make(chan jetstream.Msg, 16),
		}
		if _, err := cres.Sessions.Create(ctx, l.id.lane, l.p.commit); err != nil {
			return Result{}, fmt.Errorf("bench: floor: create entry: %w", err)
		}
		lanes[i] = l
		laneWG.Add(1)
		go func() {
			defer laneWG.Done()
			for m := range l.in {
				if err := l.turn(m); err != nil {
					cancel(fmt.Errorf("floor lane %d: %w", l.idx, err))
				}
			}
		}()
	}
	for _, lp := range loops {
		it, err := lp.res.Consumer.Messages(jetstream.PullMaxMessages(4), jetstream.PullExpiry(5*time.Second))
		if err != nil {
			return Result{}, fmt.Errorf("bench: floor: pull: %w", err)
		}
		lp.it = it
		loopWG.Add(1)
		go func() {
			defer loopWG.Done()
			for {
				m, err := it.Next()
				if err != nil {
					if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
						return
					}
					continue
				}
				i, ok := byInbox[m.Subject()]
				if !ok {
					_ = m.Ack()
					continue
				}
				lanes[i].in <- m
			}
		}()
	}

	send := func(ctx context.Context, i, n int) (sent, error) {
		l := ids[i]
		pmid := messageID(l, n)
		m := nats.NewMsg(l.inbox)
		m.Data = lanes[i].p.inbound
		m.Header.Set(broker.HdrSessionKey, l.key)
		m.Header.Set(broker.HdrKind, session.KindMessage)
		m.Header.Set(broker.HdrPlatformMsgID, pmid)
		pctx, pcancel := context.WithTimeout(ctx, floorOpTimeout)
		defer pcancel()
		start := time.Now()
		ack, err := cjs.PublishMsg(pctx, m, jetstream.WithMsgID(pmid), jetstream.WithExpectStream(names.InboxStream()))
		if err != nil {
			return sent{}, err
		}
		return sent{start: start, accepted: time.Now(), seq: ack.Sequence}, nil
	}

	r := Result{Scenario: "floor", Lanes: o.Lanes, Workers: o.Workers, Sync: o.Sync, GOMAXPROCS: procs(), LoadAvg: loadAvg(),
		Conn: e.connType(), Remote: o.NATSURL != ""}
	pr := &probe{env: e, tap: tp}
	samples, window, err := d.run(runCtx, send, hooks{start: pr.start, end: func() { pr.end(&r) }})
	stopLoops()
	if err != nil {
		return Result{}, fmt.Errorf("bench: floor: %w", err)
	}
	if o.NATSURL == "" {
		// Against a remote server the clocks differ: the PubAck stays.
		if err := restamp(ctx, cres.Inbox, samples); err != nil {
			return Result{}, err
		}
	}
	if err := fill(&r, d, samples, window); err != nil {
		return Result{}, err
	}
	perTurn(&r, tp)
	return r, nil
}

// floorLane is one lane of the floor: the state a lane owner keeps (the
// entry's revision, the transcript's last sequence).
type floorLane struct {
	id       laneID
	idx      int
	js       jetstream.JetStream
	sessions jetstream.KeyValue
	names    broker.Names
	p        floorPayloads
	in       chan jetstream.Msg
	txLast   uint64
	n        int
}

// turn runs the operations of one turn for delivery m.
func (l *floorLane) turn(m jetstream.Msg) error {
	ctx, cancel := context.WithTimeout(context.Background(), floorOpTimeout)
	defer cancel()
	md, err := m.Metadata()
	if err != nil {
		return err
	}
	l.n++
	turnID := strconv.Itoa(l.idx) + "-" + strconv.Itoa(l.n)

	// Intent: read the entry, CAS it.
	e, err := l.sessions.Get(ctx, l.id.lane)
	if err != nil {
		return fmt.Errorf("kv get: %w", err)
	}
	rev, err := l.sessions.Update(ctx, l.id.lane, l.p.intent, e.Revision())
	if err != nil {
		return fmt.Errorf("kv cas intent: %w", err)
	}
	if err := l.append(ctx, turnID+":user:"+strconv.FormatUint(md.Sequence.Stream, 10), turnID, md.Sequence.Stream, l.p.user); err != nil {
		return err
	}
	if err := l.append(ctx, turnID+":reply", turnID, 0, l.p.assistant); err != nil {
		return err
	}
	out := nats.NewMsg(l.id.outbox)
	out.Data = l.p.reply
	out.Header.Set(broker.HdrSessionKey, l.id.key)
	out.Header.Set(broker.HdrTurnID, turnID)
	if _, err := l.js.PublishMsg(ctx, out, jetstream.WithMsgID(l.p.sessionID+":"+strconv.FormatUint(l.txLast, 10))); err != nil {
		return fmt.Errorf("publish reply: %w", err)
	}
	if err := l.append(ctx, turnID+":end", turnID, 0, l.p.turnEnd); err != nil {
		return err
	}
	if _, err := l.sessions.Update(ctx, l.id.lane, l.p.commit, rev); err != nil {
		return fmt.Errorf("kv cas commit: %w", err)
	}
	return m.Ack()
}

// append stores a transcript entry on the lane's session subject only if
// the subject's tail is the one the lane last wrote.
func (l *floorLane) append(ctx context.Context, entryID, turnID string, inboxSeq uint64, data []byte) error {
	m := nats.NewMsg(l.names.TranscriptSubject(l.p.sessionID))
	m.Data = data
	m.Header.Set(broker.HdrEntryID, entryID)
	m.Header.Set(broker.HdrSessionID, l.p.sessionID)
	m.Header.Set(broker.HdrTurnID, turnID)
	if inboxSeq != 0 {
		m.Header.Set(broker.HdrInboxSeq, strconv.FormatUint(inboxSeq, 10))
	}
	ack, err := l.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(l.txLast), jetstream.WithMsgID(entryID))
	if err != nil {
		return fmt.Errorf("append %s: %w", entryID, err)
	}
	l.txLast = ack.Sequence
	return nil
}
