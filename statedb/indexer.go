package statedb

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// state_meta keys of the indexer. The cursors are the last stream
// sequence of each stream whose effects are in the file; they move in the
// same transaction as those effects, so a crash at any point loses nothing
// and applies nothing twice.
const (
	metaTxSeq      = "indexer.tx_seq"
	metaEvSeq      = "indexer.ev_seq"
	metaTxCreated  = "indexer.tx_stream_created"
	metaEvCreated  = "indexer.ev_stream_created"
	metaConsumerID = "indexer.name"
)

// End reasons the indexer records, besides the session-switch reasons a
// closed transcript entry carries (new, reset, idle, daily, suspended,
// resume, fork, switch).
const (
	EndReasonExpired = "expired"
	EndReasonPruned  = "pruned"
)

// IndexerConfig configures an Indexer.
type IndexerConfig struct {
	// Names are the fleet's names. Required.
	Names broker.Names
	// Name tells this indexer's durable consumers apart from other
	// indexers' (each indexer has its own file). Defaults to a hash of the
	// host name and the database path.
	Name string
	// BatchSize is the most stream messages applied in one transaction.
	// Defaults to 500.
	BatchSize int
	// FlushInterval is how long a partial batch waits for more messages.
	// Defaults to 50ms.
	FlushInterval time.Duration
	// MergeIdle is how long the indexer waits with nothing to apply before
	// it merges the full-text indexes' segments, one short step at a time
	// (idleMerge). Defaults to 2s; negative disables the merge.
	MergeIdle time.Duration
	// Logger receives progress and errors. Defaults to a discard logger.
	Logger *slog.Logger
}

// Indexer keeps a DB up to date with the transcript and event streams: a
// durable consumer on each, applied in batched transactions.
type Indexer struct {
	db    *DB
	res   *broker.Resources
	store *kv.Store
	cfg   IndexerConfig
	log   *slog.Logger

	mu      sync.Mutex
	applied [2]uint64 // tx, ev cursors as committed
	changed chan struct{}
}

// DefaultIndexerName is the durable-name suffix an indexer of path gets
// when none is configured: stable across restarts on one host, different
// for every file.
func DefaultIndexerName(path string) string {
	h, _ := os.Hostname()
	abs, _ := filepath.Abs(path)
	sum := sha256.Sum256([]byte(h + "\x00" + abs))
	return hex.EncodeToString(sum[:6])
}

// NewIndexer returns an indexer that writes db from the streams of res.
func NewIndexer(res *broker.Resources, db *DB, cfg IndexerConfig) (*Indexer, error) {
	if res == nil || res.Transcripts == nil || res.Events == nil || res.JS == nil {
		return nil, errors.New("statedb: indexer needs the transcript and event streams")
	}
	if db.readOnly {
		return nil, ErrReadOnly
	}
	if cfg.Name == "" {
		cfg.Name = DefaultIndexerName(db.path)
	}
	for _, r := range cfg.Name {
		if !(r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return nil, fmt.Errorf("%w: indexer name %q: only letters, digits, '-' and '_'", ErrInvalid, cfg.Name)
		}
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 500
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = 50 * time.Millisecond
	}
	if cfg.MergeIdle == 0 {
		cfg.MergeIdle = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ix := &Indexer{db: db, res: res, cfg: cfg, log: cfg.Logger, changed: make(chan struct{})}
	if res.SessionIDs != nil && res.Sessions != nil {
		ix.store = kv.NewStore(res, nil)
	}
	return ix, nil
}

// Cursors returns the last transcript and event stream sequences whose
// effects are in the file.
func (db *DB) Cursors(ctx context.Context) (tx, ev uint64, err error) {
	if tx, err = db.metaUint(ctx, db.r, metaTxSeq); err != nil {
		return 0, 0, err
	}
	ev, err = db.metaUint(ctx, db.r, metaEvSeq)
	return tx, ev, err
}

func (db *DB) metaUint(ctx context.Context, ex execer, key string) (uint64, error) {
	var v sql.NullString
	err := ex.QueryRowContext(ctx, `SELECT value FROM state_meta WHERE key = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) || !v.Valid {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(v.String, 10, 64)
}

func (db *DB) meta(ctx context.Context, ex execer, key string) (string, error) {
	var v sql.NullString
	err := ex.QueryRowContext(ctx, `SELECT value FROM state_meta WHERE key = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return v.String, err
}

func setMeta(ctx context.Context, ex execer, key, value string) error {
	_, err := ex.ExecContext(ctx, `INSERT INTO state_meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value`, key, value)
	return err
}

// Applied returns the cursors this indexer has committed so far, and a
// channel closed at its next commit.
func (ix *Indexer) Applied() (tx, ev uint64, next <-chan struct{}) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.applied[0], ix.applied[1], ix.changed
}

// ConsumerNames returns the durable consumer names this indexer uses on the
// transcript and event streams.
func (ix *Indexer) ConsumerNames() (tx, ev string) {
	return ix.cfg.Names.IndexerConsumerNamed(ix.cfg.Names.TranscriptStream(), ix.cfg.Name),
		ix.cfg.Names.IndexerConsumerNamed(ix.cfg.Names.EventStream(), ix.cfg.Name)
}

// Run indexes until ctx is cancelled. A failure (NATS unreachable, the
// file locked through every retry) restarts the consumers from the file's
// cursors after a pause; Run returns only a configuration error, or nil
// once ctx is done.
func (ix *Indexer) Run(ctx context.Context) error {
	pause := 500 * time.Millisecond
	for {
		err := ix.runOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var fatal *fatalError
		if errors.As(err, &fatal) {
			return fatal.err
		}
		ix.log.Warn("indexer restarting", slog.Any("error", err), slog.Duration("pause", pause))
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		pause = min(2*pause, 10*time.Second)
	}
}

type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }

// streamCheck makes sure the file's cursor refers to this incarnation of
// the stream: a stream deleted and created again restarts its sequences,
// and the file must then be rebuilt.
func (ix *Indexer) streamCheck(ctx context.Context, st jetstream.Stream, key string) error {
	info, err := st.Info(ctx)
	if err != nil {
		return err
	}
	created := info.Created.UTC().Format(time.RFC3339Nano)
	have, err := ix.db.meta(ctx, ix.db.r, key)
	if err != nil {
		return err
	}
	if have == "" {
		return ix.db.write(ctx, func(tx *sql.Tx) error { return setMeta(ctx, tx, key, created) })
	}
	if have != created {
		return &fatalError{fmt.Errorf("stream %s was created again (%s, the file indexed the one of %s): rebuild the database (--rebuild)",
			info.Config.Name, created, have)}
	}
	return nil
}

// consumer (re)creates the durable consumer of a stream so that it starts
// right after the file's cursor: the file, not the consumer's ack floor, is
// the authority on what is applied.
func (ix *Indexer) consumer(ctx context.Context, st jetstream.Stream, name, filter string, after uint64) (jetstream.Consumer, error) {
	if err := st.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, err
	}
	cfg := jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "agentfleet indexer of " + ix.db.path,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       2 * time.Minute,
		MaxAckPending: 20000,
		FilterSubject: filter,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if after > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = after + 1
	}
	return st.CreateOrUpdateConsumer(ctx, cfg)
}

type delivery struct {
	msg    jetstream.Msg
	stream int // 0 transcripts, 1 events
	seq    uint64
	cseq   uint64 // the consumer's delivery sequence
	at     time.Time
}

func (ix *Indexer) runOnce(ctx context.Context) error {
	if err := ix.streamCheck(ctx, ix.res.Transcripts, metaTxCreated); err != nil {
		return err
	}
	if err := ix.streamCheck(ctx, ix.res.Events, metaEvCreated); err != nil {
		return err
	}
	txc, evc, err := ix.db.Cursors(ctx)
	if err != nil {
		return err
	}
	ix.mu.Lock()
	ix.applied = [2]uint64{txc, evc}
	ix.mu.Unlock()
	txName, evName := ix.ConsumerNames()
	specs := []struct {
		st     jetstream.Stream
		name   string
		filter string
		after  uint64
	}{
		{ix.res.Transcripts, txName, ix.cfg.Names.TranscriptWildcard(), txc},
		{ix.res.Events, evName, ix.cfg.Names.EventWildcard(), evc},
	}
	ins := [2]chan delivery{make(chan delivery, ix.cfg.BatchSize), make(chan delivery, ix.cfg.BatchSize)}
	errc := make(chan error, 2)
	done := make(chan struct{})
	var wg sync.WaitGroup
	var iters []jetstream.MessagesContext
	defer func() {
		close(done)
		for _, it := range iters {
			it.Stop()
		}
		wg.Wait()
	}()
	var m merger
	for i, c := range specs {
		cons, err := ix.consumer(ctx, c.st, c.name, c.filter, c.after)
		if err != nil {
			return fmt.Errorf("consumer %s: %w", c.name, err)
		}
		m.cons[i] = cons
		it, err := cons.Messages(jetstream.PullMaxMessages(ix.cfg.BatchSize))
		if err != nil {
			return fmt.Errorf("consume %s: %w", c.name, err)
		}
		iters = append(iters, it)
		in := ins[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				msg, err := it.Next()
				if err != nil {
					select {
					case errc <- fmt.Errorf("%s: %w", c.name, err):
					default:
					}
					return
				}
				md, err := msg.Metadata()
				if err != nil {
					_ = msg.Term()
					continue
				}
				select {
				case in <- delivery{msg: msg, stream: i, seq: md.Sequence.Stream, cseq: md.Sequence.Consumer, at: md.Timestamp}:
				case <-done:
					return
				}
			}
		}()
	}
	ix.log.Info("indexer consuming", slog.String("db", ix.db.path), slog.Uint64("tx_after", txc), slog.Uint64("ev_after", evc))
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	// The idle merge: after MergeIdle with nothing received, one merge step
	// per firing, the next one right after, until the indexes have nothing
	// left to merge; whatever arrives meanwhile waits for one step at most.
	var idle *time.Timer
	var idleC <-chan time.Time
	var mg idleMerge
	if ix.cfg.MergeIdle > 0 {
		if err := ix.db.prepareMerge(ctx); err != nil {
			// Merging is an optimisation: index without it.
			ix.log.Warn("indexer: full-text merge disabled", slog.Any("error", err))
		} else {
			idle = time.NewTimer(ix.cfg.MergeIdle)
			defer idle.Stop()
			idleC = idle.C
		}
	}
	received := func() {
		if idle != nil {
			idle.Reset(ix.cfg.MergeIdle)
		}
	}
	// A stream's pending list is capped; the other stream is still read,
	// so the merge can always make progress.
	limit := 4 * ix.cfg.BatchSize
	for {
		var in0, in1 chan delivery
		if len(m.pend[0]) < limit {
			in0 = ins[0]
		}
		if len(m.pend[1]) < limit {
			in1 = ins[1]
		}
		flush := false
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case d := <-in0:
			m.add(d)
			received()
		case d := <-in1:
			m.add(d)
			received()
		case <-timer.C:
			armed = false
			flush = true
		case <-idleC:
			if m.len() > 0 || mg.done {
				idle.Reset(ix.cfg.MergeIdle)
				continue
			}
			if err := mg.step(ctx, ix.db); err != nil {
				// Merging is an optimisation: try again after the next batch.
				// A step cut short by the indexer's stop is not a fault.
				if ctx.Err() == nil {
					ix.log.Warn("indexer: full-text merge", slog.Any("error", err))
				}
				mg.done = true
			}
			if mg.done {
				idle.Reset(ix.cfg.MergeIdle)
			} else {
				idle.Reset(0)
			}
			continue
		}
		// A full batch goes at once only when the merge can release it
		// without waiting for the other stream (a batch cut short there
		// would make the next arrival of that stream flush a few rows at a
		// time, each its own transaction and FTS segment); the rest goes
		// when the timer fires.
		if m.ready(ix.cfg.BatchSize) >= ix.cfg.BatchSize {
			flush = true
		}
		if !flush {
			if !armed && m.len() > 0 {
				timer.Reset(ix.cfg.FlushInterval)
				armed = true
			}
			continue
		}
		// Full batches follow each other while the merge releases them.
		for {
			batch, err := m.take(ctx, ix.cfg.BatchSize)
			if err != nil {
				return err
			}
			if len(batch) > 0 {
				if err := ix.apply(ctx, batch); err != nil {
					return err
				}
				for _, d := range batch {
					_ = d.msg.Ack()
				}
				mg.done = false
			}
			if len(batch) < ix.cfg.BatchSize {
				break
			}
		}
		if !armed && m.len() > 0 {
			// What is left waits for the other stream: look again soon.
			timer.Reset(ix.cfg.FlushInterval)
			armed = true
		}
	}
}

// merger orders the two streams' deliveries into one sequence by the time
// the server stored each message (transcripts first on a tie), keeping each
// stream's own order. A message is released only when every message of the
// other stream stored before it is in hand, so a crash, a restart or a
// rebuild applies the two streams in the same interleaving: the file does
// not depend on how fast each consumer happened to run.
type merger struct {
	cons [2]jetstream.Consumer
	pend [2][]delivery
	last [2]uint64 // consumer sequence of the last delivery received
}

func (m *merger) add(d delivery) {
	m.pend[d.stream] = append(m.pend[d.stream], d)
	m.last[d.stream] = max(m.last[d.stream], d.cseq)
}

func (m *merger) len() int { return len(m.pend[0]) + len(m.pend[1]) }

// ready counts, up to n, the deliveries take releases without asking
// whether a stream is drained: those stored before the other stream's
// oldest pending one.
func (m *merger) ready(n int) int {
	a, b := m.pend[0], m.pend[1]
	i, j := 0, 0
	for i < len(a) && j < len(b) && i+j < n {
		if b[j].at.Before(a[i].at) {
			j++
		} else {
			i++
		}
	}
	return i + j
}

// drained reports whether every message of stream s stored so far has been
// received: its consumer has nothing pending and delivered nothing beyond
// what arrived.
func (m *merger) drained(ctx context.Context, s int) (bool, error) {
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	info, err := m.cons[s].Info(ictx)
	if err != nil {
		return false, fmt.Errorf("consumer info: %w", err)
	}
	return info.NumPending == 0 && info.Delivered.Consumer <= m.last[s], nil
}

// take removes and returns up to n deliveries in merged order.
func (m *merger) take(ctx context.Context, n int) ([]delivery, error) {
	var out []delivery
	var known [2]bool
	var drained [2]bool
	isDrained := func(s int) (bool, error) {
		if !known[s] {
			d, err := m.drained(ctx, s)
			if err != nil {
				return false, err
			}
			known[s], drained[s] = true, d
		}
		return drained[s], nil
	}
	for len(out) < n {
		a, b := m.pend[0], m.pend[1]
		pick := -1
		switch {
		case len(a) > 0 && len(b) > 0:
			pick = 0
			if b[0].at.Before(a[0].at) {
				pick = 1
			}
		case len(a) > 0 || len(b) > 0:
			s := 0
			if len(a) == 0 {
				s = 1
			}
			ok, err := isDrained(1 - s)
			if err != nil {
				return out, err
			}
			if ok {
				pick = s
			}
		}
		if pick < 0 {
			break
		}
		out = append(out, m.pend[pick][0])
		m.pend[pick] = m.pend[pick][1:]
	}
	return out, nil
}

// testHookInBatch, set by tests only, runs inside every batch's
// transaction, after its rows are written and before its cursors move.
var testHookInBatch func()

// sessionInfo is what the KV index says about a session id.
type sessionInfo struct {
	source, userID, parent, title, lane string
	created                             time.Time
}

// apply writes one batch in one transaction, cursors included.
func (ix *Indexer) apply(ctx context.Context, batch []delivery) error {
	cur := ix.applied
	type item struct {
		d     delivery
		entry *transcript.Entry
		ev    *event
		sid   string
	}
	items := make([]item, 0, len(batch))
	needed := map[string]time.Time{}
	for _, d := range batch {
		if d.seq <= cur[d.stream] {
			continue // already applied (a redelivery)
		}
		it := item{d: d}
		subj := d.msg.Subject()
		if d.stream == 0 {
			it.sid = strings.TrimPrefix(subj, ix.cfg.Names.TranscriptWildcard()[:len(ix.cfg.Names.TranscriptWildcard())-1])
			var e transcript.Entry
			if err := json.Unmarshal(d.msg.Data(), &e); err != nil {
				ix.log.Warn("undecodable transcript entry skipped", slog.String("subject", subj), slog.Uint64("seq", d.seq), slog.Any("error", err))
			} else {
				e.Seq = d.seq
				it.entry = &e
				if e.Kind == transcript.KindMessage || e.Kind == transcript.KindClosed {
					if _, ok := needed[it.sid]; !ok {
						needed[it.sid] = entryTime(&e, d.at)
					}
				}
			}
		} else {
			it.ev = decodeEvent(ix.cfg.Names, subj, d.msg.Data())
			if it.ev != nil && it.ev.affectsSession() {
				if _, ok := needed[it.ev.SessionID]; !ok {
					needed[it.ev.SessionID] = d.at
				}
			}
		}
		items = append(items, it)
	}
	// Session metadata comes from the KV index; read it before the write
	// transaction so the file is never locked across a network call.
	infos := map[string]sessionInfo{}
	for sid, first := range needed {
		exists, err := ix.db.sessionExists(ctx, sid)
		if err != nil {
			return err
		}
		if !exists {
			infos[sid] = ix.lookup(ctx, sid, first)
		}
	}
	next := cur
	for _, d := range batch {
		next[d.stream] = max(next[d.stream], d.seq)
	}
	err := ix.db.write(ctx, func(tx *sql.Tx) error {
		for _, it := range items {
			var err error
			switch {
			case it.entry != nil:
				err = applyEntry(ctx, tx, it.sid, it.entry, it.d.at, infos)
			case it.ev != nil:
				err = applyEvent(ctx, tx, it.ev, it.d.at, infos)
			}
			if err != nil {
				return fmt.Errorf("apply seq %d: %w", it.d.seq, err)
			}
		}
		if testHookInBatch != nil {
			testHookInBatch()
		}
		if next[0] != cur[0] {
			if err := setMeta(ctx, tx, metaTxSeq, strconv.FormatUint(next[0], 10)); err != nil {
				return err
			}
		}
		if next[1] != cur[1] {
			if err := setMeta(ctx, tx, metaEvSeq, strconv.FormatUint(next[1], 10)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	ix.mu.Lock()
	ix.applied = next
	close(ix.changed)
	ix.changed = make(chan struct{})
	ix.mu.Unlock()
	return nil
}

func (db *DB) sessionExists(ctx context.Context, id string) (bool, error) {
	var n int
	err := db.w.QueryRowContext(ctx, `SELECT COUNT(*) FROM sessions WHERE id = ?`, id).Scan(&n)
	return n > 0, err
}

// lookup reads a session's metadata from the KV index (title, parent,
// session key and creation time) and its lane's entry (platform, user).
// What cannot be read is left empty: the session is indexed anyway.
func (ix *Indexer) lookup(ctx context.Context, sid string, first time.Time) sessionInfo {
	info := sessionInfo{created: first, source: "unknown"}
	if ix.store == nil {
		return info
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rec, err := ix.store.LookupIndex(lctx, sid)
	if err != nil {
		if !errors.Is(err, kv.ErrNotFound) {
			ix.log.Warn("session index lookup", slog.String("session_id", sid), slog.Any("error", err))
		}
		return info
	}
	info.parent, info.title, info.lane = rec.ParentSessionID, rec.Title, rec.Lane
	if !rec.CreatedAt.IsZero() {
		info.created = rec.CreatedAt
	}
	if p := platformOf(rec.SessionKey); p != "" {
		info.source = p
	}
	if rec.Lane != "" {
		if e, _, err := ix.store.Get(lctx, rec.Lane); err == nil {
			if e.Origin != nil {
				info.userID = e.Origin.UserID
			}
			if info.source == "unknown" && e.Platform != "" {
				info.source = string(e.Platform)
			}
		}
	}
	return info
}

// platformOf returns the platform segment of a session key
// (agent:main:<platform>:...).
func platformOf(key string) string {
	parts := strings.SplitN(key, ":", 4)
	if len(parts) >= 3 && parts[0] == "agent" {
		return parts[2]
	}
	return ""
}

func entryTime(e *transcript.Entry, stored time.Time) time.Time {
	if !e.Timestamp.IsZero() {
		return e.Timestamp
	}
	return stored
}

// ensureSession creates the session row the first time the indexer meets
// a session id. A title another session already has gets the next number
// of its lineage ("Title #2"): titles are unique in the file, while the KV
// index only keeps them unique per conversation.
func ensureSession(ctx context.Context, tx *sql.Tx, sid string, first time.Time, infos map[string]sessionInfo) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM sessions WHERE id = ?`, sid).Scan(&n); err != nil || n > 0 {
		return err
	}
	info, ok := infos[sid]
	if !ok {
		info = sessionInfo{created: first, source: "unknown"}
	}
	ns := NewSession{ID: sid, Source: info.source, UserID: info.userID, ParentSessionID: info.parent, StartedAt: info.created, Lane: info.lane}
	if err := createSession(ctx, tx, ns); err != nil {
		return err
	}
	if info.title == "" {
		return nil
	}
	return assignTitle(ctx, tx, sid, info.title)
}

// assignTitle gives a session its title, or when another session has it,
// the next free number of the title's lineage. An empty title clears it.
func assignTitle(ctx context.Context, tx *sql.Tx, sid, title string) error {
	title = cleanTitle(title)
	var have sql.NullString
	if err := tx.QueryRowContext(ctx, `SELECT title FROM sessions WHERE id = ?`, sid).Scan(&have); err != nil {
		return err
	}
	if title == "" || have.String == title {
		return setTitle(ctx, tx, sid, title)
	}
	if b, _ := SplitTitle(have.String); have.Valid && b == title {
		return nil // already numbered in this title's lineage
	}
	for i := 0; i < 3; i++ {
		err := setTitle(ctx, tx, sid, title)
		if !errors.Is(err, ErrTitleTaken) {
			return err
		}
		if title, err = nextTitle(ctx, tx, title); err != nil {
			return err
		}
	}
	return nil
}

// openAIToolCalls converts transcript tool calls to the OpenAI format the
// messages table stores.
func openAIToolCalls(calls []transcript.ToolCall) any {
	if len(calls) == 0 {
		return nil
	}
	type fn struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	type call struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	out := make([]call, len(calls))
	for i, c := range calls {
		out[i] = call{ID: c.ID, Type: "function", Function: fn{Name: c.Name, Arguments: c.Arguments}}
	}
	return out
}

// countedStatuses are the turn ends that ran the agent (one API call
// sequence each).
var countedStatuses = map[string]bool{
	transcript.StatusCompleted: true, transcript.StatusFailed: true,
	transcript.StatusInterrupted: true, transcript.StatusStopped: true,
}

// applyEntry applies one transcript entry:
//   - a message is stored with the entry's stream sequence as its id;
//   - a rewind (/undo, /retry) soft-deletes the messages it covers;
//   - a closed entry ends the session with the switch's reason, and a
//     switch back to an earlier session (/resume) reopens that one;
//   - a turn_end of a turn that ran the agent counts one API call.
//
// Fences and notices are not conversation and are not stored.
func applyEntry(ctx context.Context, tx *sql.Tx, sid string, e *transcript.Entry, stored time.Time, infos map[string]sessionInfo) error {
	at := entryTime(e, stored)
	switch e.Kind {
	case transcript.KindMessage:
		switch e.Role {
		case transcript.RoleUser, transcript.RoleAssistant, transcript.RoleTool, transcript.RoleSystem:
		default:
			return nil // not something a worker writes: never let it wedge the indexer
		}
		if err := ensureSession(ctx, tx, sid, at, infos); err != nil {
			return err
		}
		m := NewMessage{ID: int64(e.Seq), SessionID: sid, Role: e.Role, Content: e.Content, ToolCallID: e.ToolCallID,
			ToolCalls: openAIToolCalls(e.ToolCalls), ToolName: e.ToolName, Timestamp: at, FinishReason: e.FinishReason,
			Reasoning: e.Reasoning}
		if len(e.ReasoningDetails) > 0 && json.Valid(e.ReasoningDetails) {
			m.ReasoningDetails = json.RawMessage(e.ReasoningDetails)
		}
		if e.TokenCount > 0 {
			n := int64(e.TokenCount)
			m.TokenCount = &n
		}
		if _, err := appendMessage(ctx, tx, m); err != nil {
			return err
		}
		if e.Role == transcript.RoleAssistant && e.TokenCount > 0 {
			return addUsage(ctx, tx, sid, Usage{OutputTokens: int64(e.TokenCount)})
		}
	case transcript.KindRewind:
		ids := make([]int64, len(e.Rewound))
		for i, s := range e.Rewound {
			ids[i] = int64(s)
		}
		return softDelete(ctx, tx, sid, ids, at)
	case transcript.KindClosed:
		if err := ensureSession(ctx, tx, sid, at, infos); err != nil {
			return err
		}
		reason := e.Reason
		if reason == "" {
			reason = "switch"
		}
		if err := endSession(ctx, tx, sid, reason, at); err != nil {
			return err
		}
		if reason == session.ReasonResume && e.NextSessionID != "" {
			return reopenSession(ctx, tx, e.NextSessionID)
		}
	case transcript.KindTurnEnd:
		if countedStatuses[e.Status] {
			return addUsage(ctx, tx, sid, Usage{APICalls: 1})
		}
	}
	return nil
}

// event is the part of a lifecycle event the indexer reads.
type event struct {
	kind        string
	Type        string  `json:"type"`
	SessionID   string  `json:"session_id"`
	InputTokens int64   `json:"input_tokens"`
	Title       *string `json:"title"`
}

func (e *event) affectsSession() bool {
	if e.SessionID == "" || !session.ValidSessionID(e.SessionID) {
		return false
	}
	switch e.kind {
	case "finalize", "pruned":
		return true
	case "title":
		return e.Title != nil
	case "turn":
		return e.Type == "end" && e.InputTokens > 0
	}
	return false
}

func decodeEvent(n broker.Names, subject string, data []byte) *event {
	rest := strings.TrimPrefix(subject, n.Prefix()+".ev.")
	kind, _, _ := strings.Cut(rest, ".")
	var e event
	if json.Unmarshal(data, &e) != nil {
		return nil
	}
	e.kind = kind
	return &e
}

// applyEvent applies one lifecycle event: an expired session that was
// finalized, or a pruned lane, ends its session; /title sets its title; a
// turn's end adds its input tokens (its output tokens come with the
// assistant entry).
func applyEvent(ctx context.Context, tx *sql.Tx, e *event, at time.Time, infos map[string]sessionInfo) error {
	if !e.affectsSession() {
		return nil
	}
	// The event stream may run ahead of the transcripts: the session is
	// created from the KV index as it would be from its first entry.
	if err := ensureSession(ctx, tx, e.SessionID, at, infos); err != nil {
		return err
	}
	switch e.kind {
	case "finalize":
		return endSession(ctx, tx, e.SessionID, EndReasonExpired, at)
	case "pruned":
		return endSession(ctx, tx, e.SessionID, EndReasonPruned, at)
	case "title":
		return assignTitle(ctx, tx, e.SessionID, *e.Title)
	case "turn":
		if e.Type == "end" && e.InputTokens > 0 {
			return addUsage(ctx, tx, e.SessionID, Usage{InputTokens: e.InputTokens})
		}
	}
	return nil
}

// RemoveFiles deletes a database file with its WAL and shared-memory
// files, for a rebuild. Missing files are not an error.
func RemoveFiles(path string) error {
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}
