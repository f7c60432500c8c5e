package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/worker"
)

// fleetDrainTimeout bounds the workers' graceful stop at the end of a run.
const fleetDrainTimeout = 10 * time.Second

// Throughput measures the real fleet in one process: an embedded server in a
// temporary directory with the configured sync policy, Options.Workers
// worker loops (each on its own in-process connection, like `agentfleet up`)
// running the echo agent without delay, and the HTTP ingress adapter on a
// loopback listener (Options.Ingress). Every lane keeps one message in
// flight; a message's latency runs from its 202 to the arrival of its reply
// on the outbox (or, with UntilMailbox, in the lane's mailbox, which also
// runs the HTTP delivery consumer).
//
// With Options.ProcessWorkers the workers are processes of
// Options.WorkerBinary connected over TCP. With Options.NATSURL and
// Options.IngressURL it measures a running fleet instead (see
// remoteThroughput).
//
// The lease TTL and the linger suit steady load: the linger outlasts the run,
// so every lane stays owned by the worker that took it during the warm-up;
// Result.Takeovers counts acquisitions inside the window (zero when it
// holds). The reset policy is "none", so no daily or idle reset lands in the
// middle of a run.
func Throughput(ctx context.Context, opts Options) (Result, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return Result{}, err
	}
	if o.NATSURL != "" {
		return remoteThroughput(ctx, o)
	}
	e, err := startEnv(o, "fleet", false)
	if err != nil {
		return Result{}, err
	}
	defer e.close()
	return runFleet(ctx, e, o, fleetExtra{})
}

// workerSet is the running workers of a fleet scenario.
type workerSet interface {
	// counters returns the lane acquisitions and redeliveries so far; ok is
	// false when they are unknown.
	counters() (takeovers, redelivered int64, ok bool)
	// stop stops every worker gracefully.
	stop() error
}

// fleetExtra adapts runFleet to a scenario.
type fleetExtra struct {
	// label names the scenario in progress reports. Defaults to "fleet".
	label string
	// lanes names the lanes. Defaults to newLaneID.
	lanes func(i int) laneID
	// atEnd runs at the end of the window, with the workers still running.
	atEnd func(ws workerSet)
}

// inprocWorkers are worker loops in this process.
type inprocWorkers struct {
	workers []*worker.Worker
	wg      sync.WaitGroup
	cancel  context.CancelFunc
	errs    chan error
	timeout time.Duration
	once    sync.Once
	err     error
}

func (w *inprocWorkers) counters() (takeovers, redelivered int64, ok bool) {
	for _, x := range w.workers {
		takeovers += x.Stats().Takeovers.Load()
		redelivered += x.Stats().Redelivered.Load()
	}
	return takeovers, redelivered, true
}

func (w *inprocWorkers) stop() error {
	w.once.Do(func() {
		w.cancel()
		if err := waitGroup(&w.wg, w.timeout); err != nil {
			w.err = fmt.Errorf("bench: workers did not stop: %w", err)
			return
		}
		select {
		case w.err = <-w.errs:
		default:
		}
	})
	return w.err
}

// startInprocWorkers runs o.Workers worker loops, each on its own
// connection; a failing worker cancels fail.
func startInprocWorkers(ctx context.Context, e *env, o Options, fail context.CancelCauseFunc) (*inprocWorkers, error) {
	wctx, cancel := context.WithCancel(context.Background())
	ws := &inprocWorkers{cancel: cancel, errs: make(chan error, o.Workers), timeout: fleetDrainTimeout + o.LeaseTTL + 5*time.Second}
	for i := range o.Workers {
		id := fmt.Sprintf("bench-%d", i+1)
		nc, js, err := e.connect("bench-fleet-worker-"+id, false)
		if err != nil {
			_ = ws.stop()
			return nil, err
		}
		res, err := e.provision(ctx, js)
		if err != nil {
			_ = ws.stop()
			return nil, err
		}
		w, err := worker.New(nc, js, res, worker.Config{
			ID: id, Names: e.names, Backend: echo.Backend(echo.Options{}),
			LeaseTTL: o.LeaseTTL, Linger: o.Linger, MaxLanes: max(64, o.Lanes),
			DrainTimeout:   fleetDrainTimeout,
			Reset:          session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}},
			Context:        session.ContextOptions{KeyOptions: session.DefaultKeyOptions()},
			Logger:         o.Logger,
			TracerProvider: o.TracerProvider,
		})
		if err != nil {
			_ = ws.stop()
			return nil, fmt.Errorf("bench: %w", err)
		}
		ws.workers = append(ws.workers, w)
		ws.wg.Add(1)
		go func() {
			defer ws.wg.Done()
			if err := w.Run(wctx); err != nil {
				ws.errs <- fmt.Errorf("worker %s: %w", id, err)
				fail(fmt.Errorf("worker %s: %w", id, err))
			}
		}()
	}
	return ws, nil
}

// runFleet measures the fleet on e (an embedded server): it provisions, runs
// the ingress and the workers (loops, or processes with
// Options.ProcessWorkers), drives the lanes and returns the result.
func runFleet(ctx context.Context, e *env, o Options, x fleetExtra) (Result, error) {
	names := e.names
	if x.label == "" {
		x.label = "fleet"
	}
	ids := make([]laneID, o.Lanes)
	subjects := make([]string, o.Lanes)
	for i := range ids {
		if x.lanes != nil {
			ids[i] = x.lanes(i)
		} else {
			ids[i] = newLaneID(names, o.RunID, i)
		}
		subjects[i] = ids[i].outbox
		if o.Until == UntilMailbox {
			subjects[i] = ids[i].mailbox
		}
	}
	d := newDriver(o, x.label, subjects)
	onc, _, err := e.connect("bench-fleet-observer", true)
	if err != nil {
		return Result{}, err
	}
	observed := names.OutboxWildcard()
	if o.Until == UntilMailbox {
		observed = names.BoxWildcard()
	}
	if err := d.observe(onc, observed); err != nil {
		return Result{}, err
	}
	var tp *tap
	if o.CountOps {
		tnc, _, err := e.connect("bench-fleet-tap", true)
		if err != nil {
			return Result{}, err
		}
		if tp, err = startTap(tnc, names); err != nil {
			return Result{}, err
		}
	}

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	// Ingress: the HTTP adapter (and the delivery consumer when measuring
	// to the mailboxes).
	_, ijs, err := e.connect("bench-fleet-ingress", false)
	if err != nil {
		return Result{}, err
	}
	ires, err := e.provision(ctx, ijs)
	if err != nil {
		return Result{}, err
	}
	isrv, err := ingress.New(ijs, ires, ingress.Config{Names: names, KeyOptions: session.DefaultKeyOptions(), Logger: o.Logger,
		TracerProvider: o.TracerProvider})
	if err != nil {
		return Result{}, fmt.Errorf("bench: %w", err)
	}
	if o.Until == UntilMailbox {
		delivery := ingress.NewDelivery(ijs, ires, names, o.Logger)
		delivery.SetTracerProvider(o.TracerProvider)
		if err := delivery.Start(runCtx); err != nil {
			return Result{}, fmt.Errorf("bench: %w", err)
		}
		defer delivery.Stop()
	}

	// Workers.
	var ws workerSet
	if o.ProcessWorkers {
		pf, err := startProcFleet(ctx, e.dir, e.url, ires, o, o.Workers, "bench-", nil)
		if err != nil {
			return Result{}, err
		}
		ws = pf
	} else {
		iw, err := startInprocWorkers(ctx, e, o, cancel)
		if err != nil {
			return Result{}, err
		}
		ws = iw
	}
	defer ws.stop() //nolint:errcheck // the error path; stop reports it otherwise

	var send sendFunc
	switch o.Ingress {
	case IngressHTTP:
		var closeHTTP func()
		send, closeHTTP, err = httpSender(o, ids, telemetry.HTTPHandler(o.TracerProvider, isrv.Handler()))
		if err != nil {
			return Result{}, err
		}
		defer closeHTTP()
	case IngressAdapter:
		send = adapterSender(o, ids, isrv.Publisher())
	case IngressPublish:
		send = publishSender(o, ids, ijs, ires, names)
	}

	r := Result{Scenario: "fleet", Lanes: o.Lanes, Workers: o.Workers, Sync: o.Sync, GOMAXPROCS: procs(), LoadAvg: loadAvg(),
		Conn: e.connType(), Ingress: o.Ingress, Until: o.Until, LeaseTTL: o.LeaseTTL, Linger: o.Linger, WorkerProcesses: o.ProcessWorkers}
	pr := &probe{env: e, tap: tp}
	var t0, r0 int64
	samples, window, err := d.run(runCtx, send, hooks{
		start: func() { pr.start(); t0, r0, _ = ws.counters() },
		end: func() {
			pr.end(&r)
			t1, r1, ok := ws.counters()
			if ok {
				r.Takeovers, r.Redelivered = t1-t0, r1-r0
			} else {
				r.Takeovers, r.Redelivered = -1, -1
			}
			if x.atEnd != nil {
				x.atEnd(ws)
			}
		},
	})
	stopErr := ws.stop()
	if err != nil {
		return Result{}, fmt.Errorf("bench: %s: %w", x.label, err)
	}
	if stopErr != nil {
		return Result{}, stopErr
	}
	if err := restamp(ctx, ires.Inbox, samples); err != nil {
		return Result{}, err
	}
	if err := fill(&r, d, samples, window); err != nil {
		return Result{}, err
	}
	perTurn(&r, tp)
	if o.Verify {
		republished, err := verify(ctx, o, ids, d, ires, names)
		r.Republished = republished
		if err != nil {
			return r, err
		}
		r.Verified = true
	}
	return r, nil
}

// remoteThroughput measures a running fleet: messages are POSTed to
// Options.IngressURL, replies are timed on the outbox of the running NATS
// (Options.NATSURL), and nothing is provisioned. The fleet's own settings
// (workers, lease TTL, linger, lanes per worker) apply; Result.Workers is
// the number of running workers in its registry.
func remoteThroughput(ctx context.Context, o Options) (Result, error) {
	if o.IngressURL == "" {
		return Result{}, errors.New("bench: a running fleet needs both the NATS URL and the ingress URL")
	}
	if o.Until == UntilMailbox {
		o.Until = UntilOutbox // the running ingress delivers; time at the outbox
	}
	e, err := startEnv(o, "fleet", false)
	if err != nil {
		return Result{}, err
	}
	defer e.close()
	names := e.names
	_, js, err := e.connect("bench-remote", false)
	if err != nil {
		return Result{}, err
	}
	res, err := bindRemote(ctx, js, names)
	if err != nil {
		return Result{}, err
	}
	ids := make([]laneID, o.Lanes)
	subjects := make([]string, o.Lanes)
	for i := range ids {
		ids[i] = newLaneID(names, o.RunID, i)
		subjects[i] = ids[i].outbox
	}
	d := newDriver(o, "fleet", subjects)
	onc, _, err := e.connect("bench-remote-observer", true)
	if err != nil {
		return Result{}, err
	}
	if err := d.observe(onc, names.OutboxWildcard()); err != nil {
		return Result{}, err
	}
	send, closeHTTP := httpClientSender(o, ids, strings.TrimRight(o.IngressURL, "/")+"/v1/messages")
	defer closeHTTP()
	workers := 0
	if recs, err := worker.ListWorkers(ctx, res.Workers); err == nil {
		for _, r := range recs {
			if r.State == worker.StateRunning {
				workers++
			}
		}
	}
	r := Result{Scenario: "fleet", Lanes: o.Lanes, Workers: workers, Sync: "server's", GOMAXPROCS: procs(), LoadAvg: loadAvg(),
		Conn: e.connType(), Ingress: IngressHTTP, Until: UntilOutbox, Takeovers: -1, Redelivered: -1, Remote: true}
	pr := &probe{env: e}
	samples, window, err := d.run(ctx, send, hooks{start: pr.start, end: func() { pr.end(&r) }})
	if err != nil {
		return Result{}, fmt.Errorf("bench: fleet at %s: %w", o.IngressURL, err)
	}
	if err := fill(&r, d, samples, window); err != nil {
		return Result{}, err
	}
	perTurn(&r, nil)
	if o.Verify {
		// The running workers may still be committing the last turns:
		// verify until it holds or a deadline passes.
		deadline := time.Now().Add(15 * time.Second)
		for {
			republished, err := verify(ctx, o, ids, d, res, names)
			r.Republished = republished
			if err == nil {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return r, err
			}
			select {
			case <-ctx.Done():
				return r, ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
		r.Verified = true
	}
	return r, nil
}

// bindRemote opens the running fleet's outbox, sessions and workers buckets
// without provisioning anything.
func bindRemote(ctx context.Context, js jetstream.JetStream, names broker.Names) (*broker.Resources, error) {
	res := &broker.Resources{JS: js}
	var err error
	if res.Outbox, err = js.Stream(ctx, names.OutboxStream()); err != nil {
		return nil, fmt.Errorf("bench: the running fleet's outbox %s: %w", names.OutboxStream(), err)
	}
	if res.Sessions, err = js.KeyValue(ctx, names.SessionsBucket()); err != nil {
		return nil, fmt.Errorf("bench: the running fleet's sessions %s: %w", names.SessionsBucket(), err)
	}
	if res.SessionIDs, err = js.KeyValue(ctx, names.SessionIDsBucket()); err != nil {
		return nil, fmt.Errorf("bench: the running fleet's session ids %s: %w", names.SessionIDsBucket(), err)
	}
	if res.Workers, err = js.KeyValue(ctx, names.WorkersBucket()); err != nil {
		return nil, fmt.Errorf("bench: the running fleet's worker registry %s: %w", names.WorkersBucket(), err)
	}
	return res, nil
}

// acceptBody is the 202 answer of POST /v1/messages.
type acceptBody struct {
	SessionKey string `json:"session_key"`
	Seq        uint64 `json:"seq"`
	Duplicate  bool   `json:"duplicate"`
}

// httpSender serves the ingress handler on a loopback listener and returns a
// sender that POSTs each message to it, keeping one connection per lane.
func httpSender(o Options, ids []laneID, h http.Handler) (sendFunc, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	send, closeClient := httpClientSender(o, ids, "http://"+ln.Addr().String()+"/v1/messages")
	closeFn := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		closeClient()
	}
	return send, closeFn, nil
}

// httpPost is the body of POST /v1/messages.
type httpPost struct {
	ChatID    string `json:"chat_id"`
	ChatType  string `json:"chat_type"`
	UserID    string `json:"user_id"`
	UserName  string `json:"user_name"`
	MessageID string `json:"message_id"`
	Text      string `json:"text"`
}

// httpClientSender returns a sender that POSTs each message to url,
// keeping one connection per lane. o.Text, when set, makes the texts.
//
// The client is the load generator, and its CPU counts in the fleet's CPU
// per turn (one process): it does no more than a lean client would. The
// request is parsed once and copied per message, each lane reuses its body
// and answer buffers, the body is written without reflection and the
// expected 202 answer is checked by comparing bytes (encoding/json reads
// any other answer). Requests go to the transport's RoundTrip, not through
// an http.Client: the ingress neither redirects nor sets cookies, and the
// client's per-request work (a copy of the headers for redirects, a
// deadline context per request for Client.Timeout) is not a lean client's.
// The transport's ResponseHeaderTimeout bounds a request instead.
func httpClientSender(o Options, ids []laneID, url string) (sendFunc, func()) {
	tr := &http.Transport{MaxIdleConns: len(ids) + 1, MaxIdleConnsPerHost: len(ids) + 1, DisableCompression: true,
		ResponseHeaderTimeout: o.ReplyTimeout}
	tmpl, tmplErr := http.NewRequest(http.MethodPost, url, nil)
	if tmplErr == nil {
		tmpl.Header = http.Header{"Content-Type": {"application/json"}}
	}
	type laneBufs struct {
		body, answer bytes.Buffer
		prefix       []byte // the 202 answer up to its seq
	}
	bufs := make([]laneBufs, len(ids))
	for i, l := range ids {
		bufs[i].prefix = fmt.Appendf(nil, `{"session_key":%s,"seq":`, mustJSON(l.key))
	}
	send := func(ctx context.Context, i, n int) (sent, error) {
		if tmplErr != nil {
			return sent{}, tmplErr
		}
		l, lb := ids[i], &bufs[i]
		lb.body.Reset()
		b := lb.body.AvailableBuffer()
		b = append(b, `{"chat_id":`...)
		b = appendJSONString(b, l.chatID)
		b = append(b, `,"chat_type":`...)
		b = appendJSONString(b, session.ChatDM)
		b = append(b, `,"user_id":`...)
		b = appendJSONString(b, l.userID)
		b = append(b, `,"user_name":`...)
		b = appendJSONString(b, l.userName)
		b = append(b, `,"message_id":"`...)
		b = strconv.AppendInt(b, int64(n), 10)
		b = append(b, `","text":`...)
		b = appendJSONString(b, o.textOf(i, n))
		b = append(b, '}')
		lb.body.Write(b)
		body := lb.body.Bytes()

		req := tmpl.WithContext(ctx)
		req.ContentLength = int64(len(body))
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return sent{}, fmt.Errorf("POST %s: %w", url, err)
		}
		lb.answer.Reset()
		_, err = lb.answer.ReadFrom(resp.Body)
		_ = resp.Body.Close()
		accepted := time.Now()
		if err != nil {
			return sent{}, err
		}
		data := lb.answer.Bytes()
		if resp.StatusCode != http.StatusAccepted {
			return sent{}, fmt.Errorf("POST /v1/messages: %s: %s", resp.Status, bytes.TrimSpace(data))
		}
		seq, ok := acceptedSeq(data, lb.prefix)
		if !ok {
			var ab acceptBody
			if err := json.Unmarshal(data, &ab); err != nil {
				return sent{}, fmt.Errorf("POST /v1/messages: %w", err)
			}
			// Another layout of a good answer (a member added or moved) is
			// judged by its values, as before the byte comparison.
			if ab.Duplicate || ab.SessionKey != l.key {
				return sent{}, fmt.Errorf("POST /v1/messages: unexpected answer %+v (want session key %s, not a duplicate)", ab, l.key)
			}
			seq = ab.Seq
		}
		return sent{start: start, accepted: accepted, token: []byte(token(i, n)), seq: seq}, nil
	}
	return send, tr.CloseIdleConnections
}

// acceptedSeq reads the seq of a 202 answer that is exactly prefix, the
// seq, `,"duplicate":false}` and white space: the answer for the lane's
// session key to a message that is not a duplicate.
func acceptedSeq(data, prefix []byte) (uint64, bool) {
	rest, ok := bytes.CutPrefix(data, prefix)
	if !ok {
		return 0, false
	}
	digits, tail, ok := bytes.Cut(rest, []byte(`,"duplicate":false}`))
	if !ok || len(bytes.TrimSpace(tail)) != 0 {
		return 0, false
	}
	seq, err := strconv.ParseUint(string(digits), 10, 64)
	return seq, err == nil
}

// appendJSONString appends s as a JSON string, as encoding/json writes it.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return append(b, mustJSON(s)...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// postMessage POSTs body to url and returns the 202's answer, when the POST
// began and when it was accepted.
func postMessage(ctx context.Context, client *http.Client, url string, body []byte) (acceptBody, time.Time, time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return acceptBody{}, time.Time{}, time.Time{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return acceptBody{}, start, time.Time{}, err
	}
	data, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	accepted := time.Now()
	if err != nil {
		return acceptBody{}, start, accepted, err
	}
	if resp.StatusCode != http.StatusAccepted {
		return acceptBody{}, start, accepted, fmt.Errorf("POST /v1/messages: %s: %s", resp.Status, bytes.TrimSpace(data))
	}
	var ab acceptBody
	if err := json.Unmarshal(data, &ab); err != nil {
		return acceptBody{}, start, accepted, fmt.Errorf("POST /v1/messages: %w", err)
	}
	return ab, start, accepted, nil
}

// adapterSender returns a sender that hands each message to the ingress in
// process, as a platform adapter does (ingress.Publisher.Publish): the same
// validation, session key, lane, msgids lookup and publish as POST
// /v1/messages, without the HTTP request, its JSON and the bench's client.
// The message id is the one the HTTP adapter derives from message_id.
func adapterSender(o Options, ids []laneID, pub *ingress.Publisher) sendFunc {
	return func(ctx context.Context, i, n int) (sent, error) {
		l := ids[i]
		mid := strconv.Itoa(n)
		src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: l.chatID, ChatType: session.ChatDM,
			UserID: l.userID, UserName: l.userName, MessageID: mid}
		m := ingress.Message{Source: src, Text: o.textOf(i, n), DedupID: ingress.PlatformMsgID(session.PlatformHTTP, l.chatID, mid)}
		start := time.Now()
		acc, err := pub.Publish(ctx, m)
		if err != nil {
			return sent{}, err
		}
		if acc.Duplicate || acc.SessionKey != l.key {
			return sent{}, fmt.Errorf("ingress publish: unexpected answer %+v (want session key %s, not a duplicate)", acc, l.key)
		}
		return sent{start: start, accepted: time.Now(), token: []byte(token(i, n)), seq: acc.Seq}, nil
	}
}

// publishSender returns a sender that does what the HTTP adapter does for a
// message with a message id, without HTTP: look the platform message id up and
// publish the inbound message with it as Msg-Id (the worker records it).
func publishSender(o Options, ids []laneID, js jetstream.JetStream, res *broker.Resources, names broker.Names) sendFunc {
	msgids := kv.NewMsgIDs(res)
	return func(ctx context.Context, i, n int) (sent, error) {
		l := ids[i]
		pmid := messageID(l, n)
		src := l.src
		src.MessageID = strconv.Itoa(n)
		start := time.Now()
		octx, cancel := context.WithTimeout(ctx, floorOpTimeout)
		defer cancel()
		if _, found, err := msgids.Lookup(octx, pmid); err != nil {
			return sent{}, err
		} else if found {
			return sent{}, fmt.Errorf("message id %s is already recorded", pmid)
		}
		t := o.textOf(i, n)
		in := session.Inbound{Source: src, SessionKey: l.key, Kind: session.KindMessage, Text: t,
			PlatformMsgID: pmid, ReceivedAt: start.UTC()}
		m := nats.NewMsg(l.inbox)
		m.Data = mustJSON(in)
		m.Header.Set(broker.HdrSessionKey, l.key)
		m.Header.Set(broker.HdrKind, session.KindMessage)
		m.Header.Set(broker.HdrPlatformMsgID, pmid)
		ack, err := js.PublishMsg(octx, m, jetstream.WithMsgID(pmid), jetstream.WithExpectStream(names.InboxStream()))
		if err != nil {
			return sent{}, err
		}
		return sent{start: start, accepted: time.Now(), token: []byte(token(i, n)), seq: ack.Sequence}, nil
	}
}

// onlyInternalAfter checks that every message of subject stored after seq
// from, up to seq to, is one of the fleet's internal messages.
func onlyInternalAfter(ctx context.Context, st jetstream.Stream, subject string, from, to uint64) error {
	for seq := from + 1; seq <= to; {
		raw, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if err != nil {
			return fmt.Errorf("read %s after seq %d: %w", subject, seq-1, err)
		}
		if raw.Sequence > to {
			return nil
		}
		if k := raw.Header.Get(broker.HdrKind); k != session.KindInternal {
			return fmt.Errorf("seq %d of %s is a %q message the bench did not send", raw.Sequence, subject, k)
		}
		seq = raw.Sequence + 1
	}
	return nil
}

// verify checks, after the workers stopped, that the outbox (and the
// mailboxes) hold exactly one reply per message sent, and that every lane
// committed its last message with no turn left in flight.
//
// It returns the strays that were re-publishes the outbox refused (see
// judgeStrays).
func verify(ctx context.Context, o Options, ids []laneID, d *driver, res *broker.Resources, names broker.Names) (int64, error) {
	var errs []error
	check := func(filter string, subjectOf func(laneID) string) {
		info, err := res.Outbox.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			errs = append(errs, fmt.Errorf("outbox info: %w", err))
			return
		}
		for i, l := range ids {
			if got, want := info.State.Subjects[subjectOf(l)], uint64(d.sent[i]); got != want {
				errs = append(errs, fmt.Errorf("lane %d: %d messages on %s, want %d (one per message sent)", i, got, subjectOf(l), want))
			}
		}
	}
	check(names.OutboxPlatformFilter(string(session.PlatformHTTP)), func(l laneID) string { return l.outbox })
	if o.Until == UntilMailbox {
		check(names.BoxWildcard(), func(l laneID) string { return l.mailbox })
	}
	store := kv.NewStore(res, nil)
	for i, l := range ids {
		e, _, err := store.Get(ctx, l.lane)
		if err != nil {
			errs = append(errs, fmt.Errorf("lane %d: %w", i, err))
			continue
		}
		if e.CommittedSeq > d.lastSeq[i] && e.Turn == nil {
			// The fleet's own wake-ups (a lease that ran out, a drain) are
			// stored in the lane's inbox too, after the bench's last
			// message: committing them is right, anything else is not.
			if err := onlyInternalAfter(ctx, res.Inbox, l.inbox, d.lastSeq[i], e.CommittedSeq); err != nil {
				errs = append(errs, fmt.Errorf("lane %d: committed seq %d, want %d: %w", i, e.CommittedSeq, d.lastSeq[i], err))
			}
			continue
		}
		if e.CommittedSeq != d.lastSeq[i] || e.Turn != nil {
			errs = append(errs, fmt.Errorf("lane %d: committed seq %d (turn in flight: %t), want %d", i, e.CommittedSeq, e.Turn != nil, d.lastSeq[i]))
		}
	}
	republished, err := judgeStrays(ctx, d, res.Outbox)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return republished, fmt.Errorf("bench: verify: %w", errors.Join(errs...))
	}
	return republished, nil
}

// judgeStrays tells the strays a user would never see from the others. The
// observer is a core subscription: it sees every publish on the outbox,
// also a second publish of a reply (the same Msg-Id) that the stream
// refused as a duplicate and so never delivers. A worker sends one when it
// finishes a turn again after its first attempt had published the reply
// (a failed commit retried, a lane taken over): by design, the Msg-Id keeps
// it from the platforms. A stray is such a re-publish when its lane had
// already taken a reply with its Msg-Id and the outbox stores exactly one
// message with it on its subject; judgeStrays returns how many strays
// were, and an error naming every other one (a stored duplicate, a reply
// to nothing sent, a reply on a subject of no lane).
func judgeStrays(ctx context.Context, d *driver, outbox jetstream.Stream) (int64, error) {
	total := d.strays.Load()
	d.strayMu.Lock()
	list := slices.Clone(d.strayList)
	d.strayMu.Unlock()
	var (
		republished int64
		errs        []error
	)
	for _, s := range list {
		if s.lane >= 0 && s.answered {
			n, err := storedWithMsgID(ctx, outbox, s.subject, s.msgID)
			if err != nil {
				errs = append(errs, fmt.Errorf("stray reply: %s: %w", s, err))
				continue
			}
			if n == 1 {
				republished++
				continue
			}
			errs = append(errs, fmt.Errorf("stray reply, stored %d times: %s", n, s))
			continue
		}
		errs = append(errs, fmt.Errorf("stray reply: %s", s))
	}
	if left := total - int64(len(list)); left > 0 {
		errs = append(errs, fmt.Errorf("%d more stray replies (not judged)", left))
	}
	if len(errs) > 0 {
		return republished, fmt.Errorf("%d stray replies (duplicates or replies to no message in flight), %d of them re-publishes the outbox refused: %w",
			total, republished, errors.Join(errs...))
	}
	return republished, nil
}

// storedWithMsgID counts the messages of subject in st stored with Msg-Id
// id.
func storedWithMsgID(ctx context.Context, st jetstream.Stream, subject, id string) (int, error) {
	n := 0
	for seq := uint64(1); ; {
		raw, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("read %s from seq %d: %w", subject, seq, err)
		}
		if raw.Header.Get(jetstream.MsgIDHeader) == id {
			n++
		}
		seq = raw.Sequence + 1
	}
}
