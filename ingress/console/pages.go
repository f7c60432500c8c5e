package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/statedb"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

// page is what every template gets.
type page struct {
	Title  string
	Nav    []navItem
	Error  string
	Notice string
	Authed bool
	Next   string
	Data   any
}

type navItem struct {
	Href, Label string
	Current     bool
}

var navPages = []navItem{
	{Href: Prefix + "/fleet", Label: "Fleet"},
	{Href: Prefix + "/lanes", Label: "Lanes"},
	{Href: Prefix + "/search", Label: "Search"},
	{Href: Prefix + "/deadletters", Label: "Dead letters"},
	{Href: Prefix + "/events", Label: "Events"},
}

var pageNames = []string{"login", "error", "fleet", "lanes", "session", "search", "deadletters", "events", "confirm", "outcome"}

// Lane states, as the Lanes page shows and filters them.
const (
	StateIdle          = "idle"
	StateRunning       = "running"
	StateResumePending = "resume_pending"
	StateSuspended     = "suspended"
)

var laneStates = []string{StateIdle, StateRunning, StateResumePending, StateSuspended}

func stateLabel(s string) string {
	switch s {
	case StateResumePending:
		return "resume pending"
	}
	return s
}

var funcs = template.FuncMap{
	"stateLabel": stateLabel,
	"iso":        func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"clock":      func(t time.Time) string { return t.UTC().Format("15:04:05") },
	"when":       func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 UTC") },
	"ago":        ago,
	"dur": func(d time.Duration) string {
		if d <= 0 {
			return "–"
		}
		return roundDur(d).String()
	},
	"snippet": snippetHTML,
}

func roundDur(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := time.Since(t)
	switch {
	case d < 2*time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return t.UTC().Format("2006-01-02")
}

// snippetHTML renders a search snippet, its matches (>>>x<<<) marked.
func snippetHTML(s string) template.HTML {
	var b strings.Builder
	for {
		i := strings.Index(s, ">>>")
		if i < 0 {
			break
		}
		j := strings.Index(s[i+3:], "<<<")
		if j < 0 {
			break
		}
		b.WriteString(template.HTMLEscapeString(s[:i]))
		b.WriteString("<mark>" + template.HTMLEscapeString(s[i+3:i+3+j]) + "</mark>")
		s = s[i+3+j+3:]
	}
	b.WriteString(template.HTMLEscapeString(s))
	return template.HTML(b.String())
}

func (c *Console) parseTemplates() error {
	base, err := template.New("base").Funcs(funcs).ParseFS(files, "templates/layout.html")
	if err != nil {
		return err
	}
	c.tmpl = map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.Must(base.Clone()).ParseFS(files, "templates/"+name+".html")
		if err != nil {
			return err
		}
		c.tmpl[name] = t
	}
	return nil
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	if p.Authed || name != "login" {
		p.Authed = p.Authed || c.admitted(token(r))
	}
	for _, n := range navPages {
		n.Current = strings.HasPrefix(r.URL.Path, n.Href)
		p.Nav = append(p.Nav, n)
	}
	var b bytes.Buffer
	if err := c.tmpl[name].ExecuteTemplate(&b, "layout", p); err != nil {
		c.log.Warn("console template", slog.String("page", name), slog.Any("error", err))
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// fragment renders one named template (a table row) to a string.
func (c *Console) fragment(name string, v any) (string, error) {
	var b bytes.Buffer
	if err := c.tmpl["error"].ExecuteTemplate(&b, name, v); err != nil {
		return "", err
	}
	return b.String(), nil
}

// ---- Lanes

// laneRow is one lane as the Lanes page shows it.
type laneRow struct {
	Lane, Key, SessionID, Platform, Owner, State, Busy string
	Queue, Backlog                                     int
	Updated                                            time.Time
}

func laneState(e *session.SessionEntry) string {
	switch {
	case e.Turn != nil:
		return StateRunning
	case e.Suspended:
		return StateSuspended
	case e.ResumePending:
		return StateResumePending
	}
	return StateIdle
}

type laneFilter struct{ platform, state string }

func (f laneFilter) match(r laneRow) bool {
	return (f.platform == "" || r.Platform == f.platform) && (f.state == "" || r.State == f.state)
}

func filterOf(r *http.Request) (laneFilter, error) {
	f := laneFilter{platform: r.URL.Query().Get("platform"), state: r.URL.Query().Get("state")}
	if f.platform != "" {
		if _, err := session.ParsePlatform(f.platform); err != nil {
			return f, err
		}
	}
	if f.state != "" && !slices.Contains(laneStates, f.state) {
		return f, fmt.Errorf("state %q: want idle, running, resume_pending or suspended", f.state)
	}
	return f, nil
}

// maxLanes bounds the lanes one page shows (each costs a lease read and an
// inbox read).
const maxLanes = 200

func (c *Console) laneRow(ctx context.Context, fl *admin.Fleet, e *session.SessionEntry) laneRow {
	lane := session.LaneToken(e.SessionKey)
	row := laneRow{Lane: lane, Key: e.SessionKey, SessionID: e.SessionID, Platform: string(e.Platform), State: laneState(e),
		Busy: e.BusyMode, Updated: e.UpdatedAt}
	if l, err := fl.ReadLease(ctx, lane); err == nil && l != nil {
		row.Owner = l.Owner
	}
	row.Queue, row.Backlog, _ = fl.LaneBacklog(ctx, lane, e)
	return row
}

func (c *Console) laneRows(ctx context.Context, fl *admin.Fleet, f laneFilter) ([]laneRow, bool, error) {
	all, err := fl.Store.ListSessions(ctx, 0)
	if err != nil {
		return nil, false, err
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].UpdatedAt.After(all[j].UpdatedAt) })
	rows := []laneRow{}
	for _, e := range all {
		if (f.platform != "" && string(e.Platform) != f.platform) || (f.state != "" && laneState(e) != f.state) {
			continue
		}
		if len(rows) == maxLanes {
			return rows, true, nil
		}
		rows = append(rows, c.laneRow(ctx, fl, e))
	}
	return rows, false, nil
}

type lanesData struct {
	Rows              []laneRow
	Truncated         bool
	Platform, State   string
	Platforms, States []string
}

func platformNames() []string {
	return []string{"http", "telegram", "slack", "discord", "whatsapp"}
}

func (c *Console) handleLanes(w http.ResponseWriter, r *http.Request) {
	f, err := filterOf(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	ctx, cancel := c.opCtx(r)
	defer cancel()
	fl, err := c.fleetFor(ctx)
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	rows, trunc, err := c.laneRows(ctx, fl, f)
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	c.render(w, r, http.StatusOK, "lanes", page{Title: "Lanes", Data: lanesData{Rows: rows, Truncated: trunc, Platform: f.platform, State: f.state,
		Platforms: platformNames(), States: laneStates}})
}

// ---- Session

type txItem struct {
	Seq          uint64
	Role         string
	At           time.Time
	Content      string
	ToolCalls    []transcript.ToolCall
	IsToolResult bool
	ToolName     string
}

type action struct {
	Op, Label string
	Danger    bool
}

type sessionData struct {
	Lane, SessionID string
	Entry           *session.SessionEntry
	State           string
	Flags           []string
	Lease           *admin.Lease
	Queue, Backlog  int
	Transcript      []txItem
	Hidden          int // earlier entries not shown
	Parents         []statedb.LineageEntry
	Children        []statedb.LineageEntry
	Recent          []string
	LineageError    string
	Actions         []action
	BusyModes       []string
}

// maxTranscript bounds the transcript entries a Session page shows (the
// newest).
const maxTranscript = 500

var laneActions = []action{
	{Op: "stop", Label: "Stop…", Danger: true},
	{Op: "reset", Label: "Reset…", Danger: true},
	{Op: "suspend", Label: "Suspend…"},
	{Op: "resume_pending", Label: "Mark resume pending…"},
	{Op: "break_lease", Label: "Break lease…", Danger: true},
}

func entryFlags(e *session.SessionEntry) []string {
	var f []string
	add := func(on bool, name string) {
		if on {
			f = append(f, name)
		}
	}
	add(e.Turn != nil, "turn in flight")
	add(e.Suspended, "suspended")
	add(e.ResumePending, "resume pending"+strings.TrimSuffix(" ("+e.ResumeReason+")", " ()"))
	add(e.WasAutoReset, "auto reset"+strings.TrimSuffix(" ("+e.AutoResetReason+")", " ()"))
	add(e.IsFreshReset, "fresh reset")
	add(e.ExpiryFinalized, "expiry finalized")
	return f
}

func (c *Console) handleSession(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := c.opCtx(r)
	defer cancel()
	fl, err := c.fleetFor(ctx)
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	lane, err := fl.ResolveLane(ctx, id)
	if err != nil {
		c.fail(w, r, http.StatusNotFound, err)
		return
	}
	e, _, err := fl.Store.Get(ctx, lane)
	if err != nil {
		c.fail(w, r, http.StatusNotFound, fmt.Errorf("session %s: %w", id, err))
		return
	}
	d := sessionData{Lane: lane, SessionID: e.SessionID, Entry: e, State: laneState(e), Flags: entryFlags(e), Actions: laneActions,
		BusyModes: admin.BusyModes, Recent: e.RecentSessions}
	if session.ValidSessionID(id) {
		d.SessionID = id
	}
	d.Lease, _ = fl.ReadLease(ctx, lane)
	d.Queue, d.Backlog, _ = fl.LaneBacklog(ctx, lane, e)
	entries, _, err := fl.TX.Load(ctx, d.SessionID)
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	for _, t := range entries {
		if t.Deleted || (t.Kind != transcript.KindMessage && t.Kind != transcript.KindNotice) {
			continue
		}
		it := txItem{Seq: t.Seq, Role: t.Role, At: t.Timestamp, Content: t.Content, ToolCalls: t.ToolCalls, ToolName: t.ToolName,
			IsToolResult: t.Role == "tool"}
		if t.Kind == transcript.KindNotice {
			it.Role = "note"
		}
		d.Transcript = append(d.Transcript, it)
	}
	var lin statedb.SessionResponse
	if err := fl.Call(ctx, statedb.EndpointSession, statedb.SessionRequest{ID: d.SessionID}, &lin); err != nil {
		switch {
		case errors.Is(err, admin.ErrNoStateDB):
			d.LineageError = "No state database answers, so only the entry's own parent is shown."
		case strings.Contains(err.Error(), "not found"):
			d.LineageError = "The state database has not indexed this session yet, so only the entry's own parent is shown."
		default:
			d.LineageError = "The state database could not answer (" + err.Error() + "), so only the entry's own parent is shown."
		}
		if e.ParentSessionID != "" && d.SessionID == e.SessionID {
			d.Parents = []statedb.LineageEntry{{ID: e.ParentSessionID}}
		}
	} else {
		if len(lin.Ancestors) > 1 {
			d.Parents = lin.Ancestors[1:2]
		}
		for _, x := range lin.Descendants {
			if x.ParentSessionID == d.SessionID {
				d.Children = append(d.Children, x)
			}
		}
	}
	if n := len(d.Transcript); n > maxTranscript {
		d.Hidden = n - maxTranscript
		d.Transcript = d.Transcript[n-maxTranscript:]
	}
	c.render(w, r, http.StatusOK, "session", page{Title: "Session " + e.SessionKey, Data: d})
}

// ---- Search

type searchData struct {
	Query   string
	Results []statedb.SearchResult
}

func (c *Console) handleSearch(w http.ResponseWriter, r *http.Request) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	d := searchData{Query: q}
	if q == "" {
		c.render(w, r, http.StatusOK, "search", page{Title: "Search", Data: d})
		return
	}
	ctx, cancel := c.opCtx(r)
	defer cancel()
	fl, err := c.fleetFor(ctx)
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	var resp statedb.SearchResponse
	if err := fl.Call(ctx, statedb.EndpointSearch, statedb.SearchRequest{Query: q, Limit: 50}, &resp); err != nil {
		status := http.StatusBadGateway
		if errors.Is(err, admin.ErrNoStateDB) {
			status = http.StatusServiceUnavailable
		}
		c.render(w, r, status, "search", page{Title: "Search", Error: err.Error(), Data: d})
		return
	}
	d.Results = resp.Results
	c.render(w, r, http.StatusOK, "search", page{Title: "Search", Data: d})
}

// ---- Dead letters

func (c *Console) handleDeadLetters(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := c.opCtx(r)
	defer cancel()
	fl, err := c.fleetFor(ctx)
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	dls, err := fl.DeadLetters(ctx, fl.DeadLetterFilter(""))
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	slices.Reverse(dls) // newest first
	c.render(w, r, http.StatusOK, "deadletters", page{Title: "Dead letters", Data: map[string]any{"Letters": dls}})
}

// ---- Events

type eventRow struct {
	Seq     uint64
	At      time.Time
	Kind    string
	Lane    string
	Summary string
}

func (c *Console) eventRow(fl *admin.Fleet, seq uint64, at time.Time, subject string, data []byte) eventRow {
	row := eventRow{Seq: seq, At: at}
	rest := strings.TrimPrefix(subject, fl.Names.Prefix()+".")
	switch {
	case strings.HasPrefix(rest, "ev."):
		row.Kind, row.Lane, _ = strings.Cut(strings.TrimPrefix(rest, "ev."), ".")
	case strings.HasPrefix(rest, "dlq."):
		row.Kind, row.Lane = "dlq", strings.TrimPrefix(rest, "dlq.")
	default:
		row.Kind = rest
	}
	row.Summary = summarize(data)
	return row
}

// summarize is an event's JSON on one line, cut short.
func summarize(data []byte) string {
	var v map[string]any
	s := string(data)
	if json.Unmarshal(data, &v) == nil {
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			switch k {
			case "lane", "at", "session_key":
				continue
			}
			b, _ := json.Marshal(v[k])
			parts = append(parts, k+"="+strings.Trim(string(b), `"`))
		}
		s = strings.Join(parts, " ")
	}
	if r := []rune(s); len(r) > 200 {
		s = string(r[:199]) + "…"
	}
	return s
}

// recentEvents are the last n messages of the events stream, newest first.
func (c *Console) recentEvents(ctx context.Context, fl *admin.Fleet, n int) ([]eventRow, error) {
	info, err := fl.Res.Events.Info(ctx)
	if err != nil {
		return nil, err
	}
	var rows []eventRow
	for seq := info.State.LastSeq; seq >= info.State.FirstSeq && seq > 0 && len(rows) < n; seq-- {
		raw, err := fl.Res.Events.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return rows, err
		}
		rows = append(rows, c.eventRow(fl, raw.Sequence, raw.Time, raw.Subject, raw.Data))
	}
	return rows, nil
}

func (c *Console) handleEvents(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := c.opCtx(r)
	defer cancel()
	fl, err := c.fleetFor(ctx)
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	rows, err := c.recentEvents(ctx, fl, 50)
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	c.render(w, r, http.StatusOK, "events", page{Title: "Events", Data: map[string]any{"Events": rows}})
}

// ---- Fleet

type chart struct {
	Title string
	SVG   template.HTML
}

type workerRow struct {
	worker.WorkerRecord
	Lanes []string
}

type fleetData struct {
	TurnsPerSec           float64
	P50, P99              time.Duration
	Backlog               uint64
	Failures, DeadLetters int
	Events                int
	Truncated             bool
	Charts                []chart
	Workers               []workerRow
}

// historyTTL is how long one read of the events stream answers the Fleet
// page (it reads up to an hour of events).
const historyTTL = 10 * time.Second

func (c *Console) history(ctx context.Context, fl *admin.Fleet) (*admin.History, error) {
	c.histMu.Lock()
	defer c.histMu.Unlock()
	if c.hist != nil && time.Since(c.histAt) < historyTTL {
		return c.hist, nil
	}
	h, err := fl.ReadHistory(ctx, admin.HistoryOptions{})
	if err != nil {
		return nil, err
	}
	c.hist, c.histAt = h, time.Now()
	return h, nil
}

func (c *Console) handleFleet(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := c.opCtx(r)
	defer cancel()
	fl, err := c.fleetFor(ctx)
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	h, err := c.history(ctx, fl)
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	d := fleetData{Events: h.Events, Truncated: h.Truncated}
	var lat []time.Duration
	turns, fails, backlog, p50s, p99s := make([]float64, len(h.Minutes)), make([]float64, len(h.Minutes)), make([]float64, len(h.Minutes)),
		make([]float64, len(h.Minutes)), make([]float64, len(h.Minutes))
	for i, m := range h.Minutes {
		turns[i] = float64(m.Turns) / 60
		fails[i] = float64(m.Failures + m.DeadLetters)
		backlog[i] = m.Backlog
		p50s[i], p99s[i] = m.P50.Seconds(), m.P99.Seconds()
		d.Failures += m.Failures
		d.DeadLetters += m.DeadLetters
		if m.P50 > 0 {
			lat = append(lat, m.P50)
		}
	}
	// The last minute that ended.
	if n := len(h.Minutes); n >= 2 {
		d.TurnsPerSec = float64(h.Minutes[n-2].Turns) / 60
		if now := time.Now(); now.Sub(h.Minutes[n-1].Start) > 0 && h.Minutes[n-1].Turns > h.Minutes[n-2].Turns {
			d.TurnsPerSec = float64(h.Minutes[n-1].Turns) / max(1, now.Sub(h.Minutes[n-1].Start).Seconds())
		}
	}
	var allP50, allP99 []time.Duration
	for _, m := range h.Minutes {
		if m.P50 > 0 {
			allP50 = append(allP50, m.P50)
			allP99 = append(allP99, m.P99)
		}
	}
	slices.Sort(allP50)
	slices.Sort(allP99)
	d.P50, d.P99 = admin.Percentile(allP50, 0.5), admin.Percentile(allP99, 0.99)
	if pending, _, err := fl.WorkersBacklog(ctx); err == nil {
		d.Backlog = pending
	}
	d.Charts = []chart{
		{Title: "Turns per second", SVG: barChart("Turns per second, per minute of the last hour", h.From, turns, "%.2f", "")},
		{Title: "Accept to reply, p50 and p99 (seconds)", SVG: lineChart("Accept-to-reply latency p50 and p99 in seconds, per minute of the last hour", h.From, p50s, p99s)},
		{Title: "Backlog (turns waiting or running)", SVG: barChart("Turns accepted and not answered, at each minute of the last hour", h.From, backlog, "%.0f", "alt")},
		{Title: "Failures and dead letters", SVG: barChart("Failed turns and dead letters, per minute of the last hour", h.From, fails, "%.0f", "bad")},
	}
	recs, err := worker.ListWorkers(ctx, fl.Res.Workers)
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	owned := c.lanesByOwner(ctx, fl)
	for _, rec := range recs {
		if rec.Owner == "" {
			rec.Owner = rec.ID
		}
		d.Workers = append(d.Workers, workerRow{WorkerRecord: rec, Lanes: owned[rec.Owner]})
	}
	c.render(w, r, http.StatusOK, "fleet", page{Title: "Fleet", Data: d})
}

// maxLeases bounds the leases the Fleet page reads.
const maxLeases = 1000

// lanesByOwner reads the live leases: the lanes each owner holds.
func (c *Console) lanesByOwner(ctx context.Context, fl *admin.Fleet) map[string][]string {
	out := map[string][]string{}
	lister, err := fl.Res.Leases.ListKeys(ctx)
	if err != nil {
		return out
	}
	var keys []string
	for k := range lister.Keys() {
		if len(keys) < maxLeases {
			keys = append(keys, k)
		}
	}
	_ = lister.Stop()
	for _, k := range keys {
		if _, err := session.ParseLaneToken(k); err != nil || strings.HasPrefix(k, "_") {
			continue // not a lane's lease (the expiry watcher's)
		}
		if l, err := fl.ReadLease(ctx, k); err == nil && l != nil {
			out[l.Owner] = append(out[l.Owner], k)
		}
	}
	for _, v := range out {
		sort.Strings(v)
	}
	return out
}

// ---- Actions

type confirmData struct {
	Op, Lane, Args, Seq string
	Question, Detail    string
	Verb, Back          string
	Danger              bool
}

type outcomeData struct {
	Outcome, Back, BackLabel string
}

// describe checks an action and says what it does.
func describe(op, lane, args, seq string) (confirmData, error) {
	d := confirmData{Op: op, Lane: lane, Args: args, Seq: seq, Back: Prefix + "/session/" + lane}
	needLane := func() error {
		if _, err := session.ParseLaneToken(lane); err != nil {
			return fmt.Errorf("lane %q: %w", lane, err)
		}
		return nil
	}
	needSeq := func() error {
		if _, err := strconv.ParseUint(seq, 10, 64); err != nil {
			return fmt.Errorf("dead letter %q: want a sequence number", seq)
		}
		return nil
	}
	switch op {
	case "stop", "reset", "suspend", "resume_pending", "busy":
		if err := needLane(); err != nil {
			return d, err
		}
		if err := admin.CheckCommand(op, args); err != nil {
			return d, err
		}
		d.Verb = "Send /" + op
		d.Question = fmt.Sprintf("Send /%s to lane %s?", strings.TrimSpace(op+" "+args), lane)
		d.Detail = map[string]string{
			"stop":           "Interrupts the running turn and suspends the session: the next message starts a fresh one.",
			"reset":          "Starts a new session for this lane.",
			"suspend":        "Suspends the session: the next message starts a fresh one.",
			"resume_pending": "Marks the session resume pending: its next turn is told the last one was interrupted.",
			"busy":           "Sets what a message does while a turn runs: interrupt it, queue behind it, or steer it.",
		}[op]
		d.Danger = op == "stop" || op == "reset"
	case "break_lease":
		if err := needLane(); err != nil {
			return d, err
		}
		d.Verb, d.Danger = "Break the lease", true
		d.Question = fmt.Sprintf("Break the lease of lane %s?", lane)
		d.Detail = "Forces a takeover, as if its owner had crashed: the owner is fenced and another worker resumes the lane."
	case "dlq_replay", "dlq_purge":
		if err := needSeq(); err != nil {
			return d, err
		}
		d.Back = Prefix + "/deadletters"
		if op == "dlq_replay" {
			d.Verb = "Replay"
			d.Question = fmt.Sprintf("Replay dead letter %s into its lane's inbox?", seq)
			d.Detail = "The message is published again as a new message; a dead letter is replayed at most once."
		} else {
			d.Verb, d.Danger = "Purge", true
			d.Question = fmt.Sprintf("Delete dead letter %s?", seq)
		}
	case "dlq_purge_all":
		d.Back, d.Verb, d.Danger = Prefix+"/deadletters", "Purge all", true
		d.Question = "Delete every dead letter?"
	default:
		return d, fmt.Errorf("no action %q", op)
	}
	return d, nil
}

func (c *Console) handleConfirm(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d, err := describe(q.Get("op"), q.Get("lane"), q.Get("args"), q.Get("seq"))
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	c.render(w, r, http.StatusOK, "confirm", page{Title: "Confirm", Data: d})
}

func (c *Console) handleAction(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	op, lane, args, seqArg := r.PostFormValue("op"), r.PostFormValue("lane"), r.PostFormValue("args"), r.PostFormValue("seq")
	d, err := describe(op, lane, args, seqArg)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	ctx, cancel := c.opCtx(r)
	defer cancel()
	fl, err := c.fleetFor(ctx)
	if err != nil {
		c.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	seq, _ := strconv.ParseUint(seqArg, 10, 64)
	out := outcomeData{Back: d.Back, BackLabel: "Back"}
	switch op {
	case "stop", "reset", "suspend", "resume_pending", "busy":
		at, err := fl.PublishCommand(ctx, lane, op, args)
		if err != nil {
			c.fail(w, r, http.StatusBadGateway, fmt.Errorf("/%s for %s: %w", op, lane, err))
			return
		}
		out.Outcome = fmt.Sprintf("Queued /%s for %s at inbox seq %d: its owner applies it in order with the lane's messages.",
			strings.TrimSpace(op+" "+args), lane, at)
		out.BackLabel = "Back to the session"
	case "break_lease":
		broken, err := fl.BreakLease(ctx, lane)
		if err != nil {
			c.fail(w, r, http.StatusBadGateway, err)
			return
		}
		out.BackLabel = "Back to the session"
		if broken == nil {
			out.Outcome = lane + ": no lease held; nothing to break."
		} else {
			out.Outcome = fmt.Sprintf("Broke the lease of %s held by %s (epoch %d): the next owner takes over at a higher epoch.", lane, broken.Owner, broken.Epoch)
		}
	case "dlq_replay":
		rep, err := fl.ReplayDeadLetter(ctx, seq)
		if err != nil {
			c.fail(w, r, http.StatusBadGateway, err)
			return
		}
		out.BackLabel = "Back to the dead letters"
		if rep.Duplicate {
			out.Outcome = fmt.Sprintf("Dead letter %d was replayed before (inbox seq %d): not published again.", seq, rep.InboxSeq)
		} else {
			out.Outcome = fmt.Sprintf("Replayed dead letter %d into %s at inbox seq %d.", seq, rep.Lane, rep.InboxSeq)
		}
	case "dlq_purge":
		if err := fl.PurgeDeadLetter(ctx, seq); err != nil {
			c.fail(w, r, http.StatusBadGateway, err)
			return
		}
		out.Outcome, out.BackLabel = fmt.Sprintf("Purged dead letter %d.", seq), "Back to the dead letters"
	case "dlq_purge_all":
		n, err := fl.PurgeDeadLetters(ctx, "")
		if err != nil {
			c.fail(w, r, http.StatusBadGateway, err)
			return
		}
		out.Outcome, out.BackLabel = fmt.Sprintf("Purged %d dead letter(s).", n), "Back to the dead letters"
	}
	c.log.Info("console action", slog.String("op", op), slog.String("lane", lane), slog.String("args", args), slog.String("seq", seqArg), slog.String("outcome", out.Outcome))
	c.render(w, r, http.StatusOK, "outcome", page{Title: "Done", Data: out})
}
