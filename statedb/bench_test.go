package statedb

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/transcript"
)

// corpus generates message texts: words drawn from a Zipf distribution over
// a synthetic vocabulary (so a few words are everywhere and most are rare,
// as in real text), and 1% of the messages in Chinese.
type corpus struct {
	rng   *rand.Rand
	zipf  *rand.Zipf
	vocab []string
	cjk   []string
}

func newCorpus(seed uint64) *corpus {
	rng := rand.New(rand.NewPCG(seed, 1))
	syll := []string{"ka", "lo", "mi", "ren", "dus", "to", "fa", "ber", "xi", "nor", "ul", "pe", "gra", "vin", "so", "tek"}
	vocab := make([]string, 20000)
	for i := range vocab {
		var b strings.Builder
		n := i
		for j := 0; j < 2+i%3; j++ {
			b.WriteString(syll[n%len(syll)])
			n /= len(syll)
			n += j * 7
		}
		vocab[i] = b.String() + strconv.Itoa(i%97)
	}
	cjk := []string{"部署", "服务器", "数据库", "迁移", "配置", "日志", "网络", "容器", "集群", "备份", "监控", "告警"}
	return &corpus{rng: rng, zipf: rand.NewZipf(rng, 1.1, 2, uint64(len(vocab)-1)), vocab: vocab, cjk: cjk}
}

func (c *corpus) text() string {
	if c.rng.IntN(100) == 0 {
		var b strings.Builder
		for i := 0; i < 6+c.rng.IntN(10); i++ {
			b.WriteString(c.cjk[c.rng.IntN(len(c.cjk))])
		}
		return b.String()
	}
	n := 8 + c.rng.IntN(30)
	words := make([]string, n)
	for i := range words {
		words[i] = c.vocab[c.zipf.Uint64()]
	}
	return strings.Join(words, " ")
}

// BenchmarkIndexer measures the indexer: turns and messages applied per
// second from FLEET_TX and FLEET_EV on an embedded nats-server into a fresh
// file, beside the floor measured in the same run: the same message rows
// inserted into the same schema (both FTS indexes) by plain INSERTs, as
// many rows per transaction as an indexer batch holds (STATEDB_BENCH_BATCH
// stream messages, by default the indexer's 500), with no NATS and no
// decoding.
// Each turn is what a worker writes for one: the user and assistant
// entries and the turn_end entry on FLEET_TX, the turn's end event (with
// its input tokens) on FLEET_EV.
//
// It also reports the indexed turn rate over the fleet's peak turn rate
// (STATEDB_BENCH_FLEET_TURNS, by default 2661 turns/s: the best fleet rate
// in docs/benchmarks.md), the headroom: above 1 the indexer keeps up; and
// the floor again into a file whose word index has no prefix indexes (the
// storage design's definition): prefix/noprefix is what they cost.
//
//	go test -run '^$' -bench BenchmarkIndexer -benchtime 1x ./statedb
func BenchmarkIndexer(b *testing.B) {
	turns := envInt("STATEDB_BENCH_TURNS", 20000)
	fleetPeak := float64(envInt("STATEDB_BENCH_FLEET_TURNS", 2661))
	const sessions = 200
	srv := natstest.RunServer(b)
	nc := srv.Connect(b)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	names := broker.MustNames("fleet")
	ctx := context.Background()
	res, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: names})
	if err != nil {
		b.Fatal(err)
	}
	c := newCorpus(1)
	store := kv.NewStore(res, nil)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sids := make([]string, sessions)
	lanes := make([]string, sessions)
	for i := range sids {
		sids[i] = session.NewSessionID(base.Add(time.Duration(i) * time.Second))
		key := fmt.Sprintf("agent:main:http:dm:u%d", i)
		lanes[i] = session.LaneToken(key)
		if err := store.Index(ctx, sids[i], kv.IndexRecord{Lane: lanes[i], SessionKey: key, CreatedAt: base}); err != nil {
			b.Fatal(err)
		}
	}
	var rows []benchRow
	pub := func(subj string, v any) {
		data, _ := json.Marshal(v)
		if _, err := js.PublishAsync(subj, data); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < turns; i++ {
		s := i % sessions
		at := base.Add(time.Duration(i) * time.Millisecond)
		turnID := transcript.NewID()
		for _, role := range []string{"user", "assistant"} {
			r := benchRow{sids[s], role, c.text(), at}
			rows = append(rows, r)
			pub(names.TranscriptSubject(r.sid), transcript.Entry{ID: transcript.NewID(), Kind: transcript.KindMessage, TurnID: turnID,
				Role: role, Content: r.content, Timestamp: at})
		}
		pub(names.TranscriptSubject(sids[s]), transcript.Entry{ID: transcript.NewID(), Kind: transcript.KindTurnEnd, TurnID: turnID,
			Status: transcript.StatusCompleted, Timestamp: at})
		pub(names.EventSubject("turn", lanes[s]), map[string]any{"type": "end", "session_id": sids[s], "turn_id": turnID, "input_tokens": 100})
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("publish did not complete")
	}
	var last [2]uint64
	for i, st := range []jetstream.Stream{res.Transcripts, res.Events} {
		info, err := st.Info(ctx)
		if err != nil {
			b.Fatal(err)
		}
		last[i] = info.State.LastSeq
	}
	n := len(rows)
	ixBatch := envInt("STATEDB_BENCH_BATCH", 500)
	dir := b.TempDir()
	var idxRate, rawRate, rawPlainRate float64
	for i := 0; b.Loop(); i++ {
		// The indexer, from an empty file to both streams' last message.
		db, err := Open(ctx, filepath.Join(dir, fmt.Sprintf("ix%d.db", i)), nil)
		if err != nil {
			b.Fatal(err)
		}
		ix, err := NewIndexer(res, db, IndexerConfig{Names: names, Name: fmt.Sprintf("bench%d", i), BatchSize: ixBatch})
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- ix.Run(rctx) }()
		for {
			tx, ev, next := ix.Applied()
			if tx >= last[0] && ev >= last[1] {
				break
			}
			select {
			case <-next:
			case <-time.After(5 * time.Minute):
				b.Fatal("indexer stalled")
			}
		}
		el := time.Since(start)
		cancel()
		<-done
		var got int
		if err := db.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM messages`).Scan(&got); err != nil || got != n {
			b.Fatalf("indexed %d messages, want %d (%v)", got, n, err)
		}
		db.Close()
		idxRate = float64(n) / el.Seconds()

		// The floor: the same rows, plain INSERTs, the indexer's batch size;
		// then the same into a file whose word index has no prefix indexes
		// (the storage design's definition), for what they cost.
		rawRate = rawInserts(ctx, b, filepath.Join(dir, fmt.Sprintf("raw%d.db", i)), sids, base, rows, ixBatch, false)
		rawPlainRate = rawInserts(ctx, b, filepath.Join(dir, fmt.Sprintf("plain%d.db", i)), sids, base, rows, ixBatch, true)
	}
	b.ReportMetric(idxRate, "indexed_msgs/s")
	b.ReportMetric(idxRate/2, "indexed_turns/s")
	b.ReportMetric(rawRate, "raw_insert_msgs/s")
	b.ReportMetric(idxRate/rawRate, "indexer/raw")
	b.ReportMetric(idxRate/2/fleetPeak, "indexer/fleet_peak")
	b.ReportMetric(rawPlainRate, "raw_noprefix_msgs/s")
	b.ReportMetric(rawRate/rawPlainRate, "prefix/noprefix")
}

// benchRow is a message row of BenchmarkIndexer.
type benchRow struct {
	sid, role, content string
	at                 time.Time
}

// rawInserts writes rows into a fresh file by plain INSERTs, as many rows
// per transaction as an indexer batch of ixBatch stream messages holds, and
// returns the rows per second. plain gives the file's word index the
// storage design's definition (no prefix indexes).
func rawInserts(ctx context.Context, b *testing.B, path string, sids []string, base time.Time, rows []benchRow, ixBatch int, plain bool) float64 {
	b.Helper()
	raw, err := Open(ctx, path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	if plain {
		err := raw.write(ctx, func(tx *sql.Tx) error {
			for _, s := range []string{`DROP TABLE messages_fts`, `CREATE VIRTUAL TABLE messages_fts USING fts5(content, tool_name, tool_calls)`} {
				if _, err := tx.ExecContext(ctx, s); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	for _, sid := range sids {
		if err := raw.CreateSession(ctx, NewSession{ID: sid, Source: "http", StartedAt: base}); err != nil {
			b.Fatal(err)
		}
	}
	n := len(rows)
	start := time.Now()
	// A batch of ixBatch stream messages holds ixBatch/2 message rows
	// (two of a turn's four stream messages are messages).
	batch := max(ixBatch/2, 1)
	for off := 0; off < n; off += batch {
		err := raw.write(ctx, func(tx *sql.Tx) error {
			st, err := tx.PrepareContext(ctx, `INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)`)
			if err != nil {
				return err
			}
			defer st.Close()
			for _, r := range rows[off:min(off+batch, n)] {
				if _, err := st.ExecContext(ctx, r.sid, r.role, r.content, unix(r.at)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return float64(n) / time.Since(start).Seconds()
}

// BenchmarkSearch measures SearchMessages latency (p50, p99, per query
// kind and overall) beside the floor measured in the same run: each query's
// newest 20 matches read from FTS5 alone (the sanitized query on the word
// index, the Chinese one on the trigram index; no ranking, snippets,
// context or filters). Over a generated database: 100k messages by default,
// STATEDB_BENCH_ROWS=1000000 for the 1M run. STATEDB_BENCH_DB=FILE keeps the
// generated file for later runs.
//
//	STATEDB_BENCH_ROWS=1000000 go test -run '^$' -bench BenchmarkSearch -benchtime 1x -timeout 60m ./statedb
func BenchmarkSearch(b *testing.B) {
	rows := envInt("STATEDB_BENCH_ROWS", 100000)
	ctx := context.Background()
	path := os.Getenv("STATEDB_BENCH_DB")
	if path == "" {
		path = filepath.Join(b.TempDir(), "search.db")
	}
	opened := time.Now()
	db, err := Open(ctx, path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	if d := time.Since(opened); d > time.Second {
		// An existing file brought up to this build's schema (e.g. the word
		// index's prefix indexes added to a file built without them).
		b.Logf("opened %s in %v", path, d.Round(time.Millisecond))
	}
	c := newCorpus(2)
	var have int
	if err := db.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM messages`).Scan(&have); err != nil {
		b.Fatal(err)
	}
	if have < rows {
		start := time.Now()
		if err := generate(ctx, db, c, have, rows); err != nil {
			b.Fatal(err)
		}
		b.Logf("generated %d messages in %v", rows-have, time.Since(start).Round(time.Second))
	}
	// Queries: words from the same distribution as the text (so some are
	// common), pairs, phrases, prefixes, Chinese terms.
	qc := newCorpus(3)
	type query struct{ kind, q string }
	var queries []query
	for i := 0; i < 100; i++ {
		w1, w2 := qc.vocab[qc.zipf.Uint64()], qc.vocab[qc.zipf.Uint64()]
		queries = append(queries,
			query{"word", w1},
			query{"two words", w1 + " " + w2},
			query{"phrase", `"` + w1 + " " + w2 + `"`},
			query{"prefix", w1[:min(4, len(w1))] + "*"},
			query{"cjk", qc.cjk[i%len(qc.cjk)] + qc.cjk[(i+1)%len(qc.cjk)]},
		)
	}
	// STATEDB_BENCH_COMPARE=FILE runs every query on a second file too (the
	// same messages, e.g. a copy whose FTS segments were merged), the two
	// alternating query by query, so that both see the same load;
	// STATEDB_BENCH_COMPARE_NOMMAP=1 opens it without the read connections'
	// memory map (the same file twice: what the map changes).
	files := []*DB{db}
	if other := os.Getenv("STATEDB_BENCH_COMPARE"); other != "" {
		db2, err := Open(ctx, other, &Options{noMmap: os.Getenv("STATEDB_BENCH_COMPARE_NOMMAP") == "1"})
		if err != nil {
			b.Fatal(err)
		}
		defer db2.Close()
		files = append(files, db2)
	}
	type timings struct {
		per, perFloor, perCPU map[string][]time.Duration
		all, floor, cpu       []time.Duration
		slow                  []slowQuery
	}
	tm := make([]timings, len(files))
	for i := range tm {
		tm[i] = timings{per: map[string][]time.Duration{}, perFloor: map[string][]time.Duration{}, perCPU: map[string][]time.Duration{}}
	}
	for b.Loop() {
		for qi, q := range queries {
			for k := range files {
				// Alternate which file goes first.
				f := (k + qi) % len(files)
				d, fl, c := searchOnce(ctx, b, files[f], q.q)
				t := &tm[f]
				t.perCPU[q.kind] = append(t.perCPU[q.kind], c)
				t.cpu = append(t.cpu, c)
				t.per[q.kind] = append(t.per[q.kind], d)
				t.perFloor[q.kind] = append(t.perFloor[q.kind], fl)
				t.all = append(t.all, d)
				t.floor = append(t.floor, fl)
				t.slow = append(t.slow, slowQuery{q.kind, q.q, d, fl})
			}
		}
	}
	p := func(ds []time.Duration, q float64) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		i := int(math.Ceil(q*float64(len(s)))) - 1
		return float64(s[max(i, 0)].Microseconds()) / 1000
	}
	for f, t := range tm {
		name, suffix := "", ""
		if f > 0 {
			name, suffix = "compare: ", "_cmp"
		}
		kinds := slices.Sorted(maps.Keys(t.per))
		for _, kind := range kinds {
			ds, fl, c := t.per[kind], t.perFloor[kind], t.perCPU[kind]
			fmt.Fprintf(os.Stderr, "%s%-9s p50 %7.2f ms  p99 %7.2f ms  floor p50 %6.2f ms  p99 %7.2f ms  cpu p50 %6.2f ms  p99 %7.2f ms  (%d queries)\n", name, kind,
				p(ds, 0.5), p(ds, 0.99), p(fl, 0.5), p(fl, 0.99), p(c, 0.5), p(c, 0.99), len(ds))
		}
		// The slowest queries, to tell a query's own cost from the load's.
		slices.SortFunc(t.slow, func(a, b slowQuery) int { return cmp.Compare(b.d, a.d) })
		for _, s := range t.slow[:min(8, len(t.slow))] {
			fmt.Fprintf(os.Stderr, "%sslow: %-9s %-28q %7.1f ms (floor %6.1f ms)\n", name, s.kind, s.q, float64(s.d.Microseconds())/1000, float64(s.floor.Microseconds())/1000)
		}
		b.ReportMetric(p(t.cpu, 0.5), "cpu_p50_ms"+suffix)
		b.ReportMetric(p(t.cpu, 0.99), "cpu_p99_ms"+suffix)
		b.ReportMetric(p(t.all, 0.5), "p50_ms"+suffix)
		b.ReportMetric(p(t.all, 0.99), "p99_ms"+suffix)
		b.ReportMetric(p(t.floor, 0.5), "floor_p50_ms"+suffix)
		b.ReportMetric(p(t.floor, 0.99), "floor_p99_ms"+suffix)
		b.ReportMetric(p(t.all, 0.99)/p(t.floor, 0.99), "p99/floor_p99"+suffix)
	}
	b.ReportMetric(float64(rows), "messages")
}

// generate writes messages from..to (exclusive) across sessions of 50
// messages. The rows go in with the full-text triggers dropped, then each
// FTS table is filled from them in large INSERT … SELECT transactions and
// the triggers are put back: the same file the indexer would write, built
// several times faster.
func generate(ctx context.Context, db *DB, c *corpus, from, to int) error {
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	srcs := []string{"telegram", "slack", "http", "discord", "whatsapp"}
	var firstID int64
	err := db.write(ctx, func(tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(id), 0) + 1 FROM messages`).Scan(&firstID); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DROP TRIGGER IF EXISTS messages_fts_insert`)
		return err
	})
	if err != nil {
		return err
	}
	const batch = 20000
	for off := from; off < to; off += batch {
		err := db.write(ctx, func(tx *sql.Tx) error {
			st, err := tx.PrepareContext(ctx, `INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)`)
			if err != nil {
				return err
			}
			defer st.Close()
			for i := off; i < min(off+batch, to); i++ {
				sid := fmt.Sprintf("s%07d", i/50)
				at := base.Add(time.Duration(i) * time.Second)
				if i%50 == 0 {
					if err := createSession(ctx, tx, NewSession{ID: sid, Source: srcs[(i/50)%len(srcs)], StartedAt: at}); err != nil {
						return err
					}
				}
				role := "user"
				if i%2 == 1 {
					role = "assistant"
				}
				if _, err := st.ExecContext(ctx, sid, role, c.text(), unix(at)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	var lastID int64
	if err := db.r.QueryRowContext(ctx, `SELECT COALESCE(MAX(id), 0) FROM messages`).Scan(&lastID); err != nil {
		return err
	}
	for _, t := range []string{"messages_fts", "messages_fts_trigram"} {
		for lo := firstID; lo <= lastID; lo += 100000 {
			err := db.write(ctx, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO `+t+`(rowid, content, tool_name, tool_calls)
					SELECT id, content, tool_name, tool_calls FROM messages WHERE id BETWEEN ? AND ?`, lo, lo+99999)
				return err
			})
			if err != nil {
				return err
			}
		}
	}
	return db.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, ftsV11[2])
		return err
	})
}

// slowQuery is a query of BenchmarkSearch and its times.
type slowQuery struct {
	kind, q  string
	d, floor time.Duration
}

// searchOnce runs one search and its floor (FTS5 alone, the newest 20
// matches of the same query: no ranking, snippets, context nor filters)
// and returns both durations, and the CPU time the process used during
// the search (what the load of other processes does not inflate).
func searchOnce(ctx context.Context, b *testing.B, db *DB, q string) (search, floor, cpu time.Duration) {
	start, cpu0 := time.Now(), processCPU()
	if _, err := db.SearchMessages(ctx, q, SearchOptions{}); err != nil {
		b.Fatalf("%s: %v", q, err)
	}
	search, cpu = time.Since(start), processCPU()-cpu0
	table, match := "messages_fts", SanitizeQuery(q)
	if HasCJK(q) {
		table, match = "messages_fts_trigram", `"`+q+`"`
	}
	start = time.Now()
	rows, err := db.r.QueryContext(ctx, `SELECT rowid FROM `+table+` WHERE `+table+` MATCH ? ORDER BY rowid DESC LIMIT 20`, match)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
	}
	rows.Close()
	return search, time.Since(start), cpu
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkMergeFTS merges the FTS segments of an existing file
// (STATEDB_BENCH_DB, changed in place: run it on a copy) step by step, as
// the idle indexer does (idleMerge), and reports the whole merge's time,
// the number of steps and the longest step (each step holds the write
// lock). STATEDB_BENCH_MERGE_PAGES sets the pages per step (default
// mergePages); STATEDB_BENCH_MERGE_FULL=1 merges each index into one
// segment (the first step negative) instead of the indexer's merge.
//
//	STATEDB_BENCH_DB=/tmp/copy.db go test -run '^$' -bench BenchmarkMergeFTS -benchtime 1x -timeout 60m ./statedb
func BenchmarkMergeFTS(b *testing.B) {
	path := os.Getenv("STATEDB_BENCH_DB")
	if path == "" {
		b.Skip("STATEDB_BENCH_DB not set")
	}
	pages := envInt("STATEDB_BENCH_MERGE_PAGES", mergePages)
	full := os.Getenv("STATEDB_BENCH_MERGE_FULL") == "1"
	ctx := context.Background()
	db, err := Open(ctx, path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	// steps: every step's time; plain: those of steps that did not end
	// with the passive WAL checkpoint every CheckpointEvery writes.
	var steps, plain []time.Duration
	var total time.Duration
	timed := func(st time.Time, checkpoint bool) {
		d := time.Since(st)
		steps = append(steps, d)
		if !checkpoint {
			plain = append(plain, d)
		}
	}
	willCheckpoint := func() bool {
		db.mu.Lock()
		defer db.mu.Unlock()
		return db.writes == CheckpointEvery-1
	}
	for b.Loop() {
		for _, t := range ftsTables {
			before, err := db.ftsSegments(ctx, t)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			n := 0
			if full {
				st, cp := time.Now(), willCheckpoint()
				if _, err := db.mergeStep(ctx, t, -pages); err != nil {
					b.Fatal(err)
				}
				timed(st, cp)
				n++
			} else if err := db.prepareMerge(ctx); err != nil {
				b.Fatal(err)
			}
			for {
				st, cp := time.Now(), willCheckpoint()
				did, err := db.mergeStep(ctx, t, pages)
				if err != nil {
					b.Fatal(err)
				}
				timed(st, cp)
				n++
				if !did {
					break
				}
			}
			el := time.Since(start)
			total += el
			after, err := db.ftsSegments(ctx, t)
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("%s: segments per level %v -> %v, %d steps of %d pages in %v", t, before, after, n, pages, el.Round(time.Millisecond))
		}
	}
	slices.Sort(steps)
	slices.Sort(plain)
	if len(plain) > 0 {
		b.ReportMetric(float64(plain[int(math.Ceil(0.99*float64(len(plain))))-1].Microseconds())/1000, "nocheckpoint_step_p99_ms")
		b.ReportMetric(float64(plain[len(plain)-1].Microseconds())/1000, "nocheckpoint_step_max_ms")
	}
	b.ReportMetric(total.Seconds(), "merge_s")
	b.ReportMetric(float64(len(steps)), "steps")
	b.ReportMetric(float64(steps[len(steps)/2].Microseconds())/1000, "step_p50_ms")
	b.ReportMetric(float64(steps[int(math.Ceil(0.99*float64(len(steps))))-1].Microseconds())/1000, "step_p99_ms")
	b.ReportMetric(float64(steps[len(steps)-1].Microseconds())/1000, "step_max_ms")
}
