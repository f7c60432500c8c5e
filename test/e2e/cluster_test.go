package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
	"github.com/agentfleet/agentfleet/worker"
)

// Settings every child process of a cluster shares.
const (
	leaseTTL     = 3 * time.Second
	startTimeout = 30 * time.Second
)

// cluster is a fleet of real processes: one `agentfleet nats` node, an
// optional `agentfleet ingress` and any number of `agentfleet worker`s, plus
// the test's own NATS connection to read the state directly.
type cluster struct {
	t        *testing.T
	dir      string
	env      []string
	natsURL  string
	nats     *proc
	ingress  *proc
	httpBase string
	hc       *http.Client

	nc    *nats.Conn
	js    jetstream.JetStream
	res   *broker.Resources
	names broker.Names
	store *kv.Store
	tx    *transcript.Log
}

// newCluster starts a NATS node on a free port with a temporary store,
// connects to it and provisions the fleet's resources with the lease TTL
// the children use (so nobody reconfigures the workers consumer).
func newCluster(t *testing.T) *cluster {
	t.Helper()
	return newClusterTTL(t, leaseTTL, time.Second)
}

// newClusterTTL is newCluster with another lease TTL and margin.
func newClusterTTL(t *testing.T, ttl, margin time.Duration) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	dir := t.TempDir()
	addr := freeAddr(t)
	c := &cluster{t: t, dir: dir, natsURL: "nats://" + addr, names: broker.MustNames(broker.DefaultPrefix)}
	c.env = []string{
		"NATS_URL=" + c.natsURL,
		"AGENTFLEET_LEASE_TTL=" + ttl.String(),
		"AGENTFLEET_LEASE_MARGIN=" + margin.String(),
		"AGENTFLEET_WORKER_LINGER=1s",
		"AGENTFLEET_AGENT_RESTART_DRAIN_TIMEOUT=2s",
		// No automatic reset: a run that crosses the daily reset hour must
		// not change session ids.
		"AGENTFLEET_SESSION_RESET_MODE=none",
		"AGENTFLEET_TELEMETRY_LOG_FORMAT=text",
	}
	c.nats = newProc(t, dir, "nats", c.env, "nats", "--listen", addr, "--data", dir+"/nats-data", "--name", "e2e")
	c.nats.start()

	waitFor(t, startTimeout, "the nats process to accept clients", func() error {
		if !c.nats.alive() {
			return fatalf("the nats process exited")
		}
		nc, err := nats.Connect(c.natsURL, nats.Timeout(time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		if err != nil {
			return err
		}
		c.nc = nc
		return nil
	})
	t.Cleanup(c.nc.Close) // before the nats process is killed (cleanups run last-in first-out)
	js, err := jetstream.New(c.nc)
	if err != nil {
		t.Fatal(err)
	}
	c.js = js
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c.res, err = broker.Provision(ctx, js, broker.ProvisionConfig{Names: c.names, LeaseTTL: ttl})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	c.store = kv.NewStore(c.res, nil)
	if c.tx, err = transcript.New(js, c.names, nil); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	c.hc = &http.Client{Transport: tr, Timeout: 90 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return c
}

// startIngress starts `agentfleet ingress` on a free port and waits for
// /readyz to answer 200.
func (c *cluster) startIngress() {
	c.t.Helper()
	addr := freeAddr(c.t)
	c.httpBase = "http://" + addr
	c.ingress = newProc(c.t, c.dir, "ingress", c.env, "ingress", "--http", addr)
	c.ingress.start()
	waitReady(c.t, c.hc, c.httpBase, c.ingress)
}

// waitReady waits until GET /readyz answers 200.
func waitReady(t testing.TB, hc *http.Client, base string, p *proc) {
	t.Helper()
	waitFor(t, startTimeout, p.name+" /readyz", func() error {
		if !p.alive() {
			return fatalf("%s exited", p.name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %d: %s", resp.StatusCode, body)
		}
		return nil
	})
}

// workerProc is an `agentfleet worker` process.
type workerProc struct {
	*proc
	id string
	// owner is the owner id ("<id>/<incarnation>") the current incarnation
	// writes into leases and entries.
	owner string
}

var startedRE = regexp.MustCompile(`msg="worker started".* worker=(\S+)`)

// startWorker starts `agentfleet worker --id id` and waits until it pulls.
func (c *cluster) startWorker(id string, extraEnv ...string) *workerProc {
	c.t.Helper()
	env := append(append([]string(nil), c.env...), extraEnv...)
	w := &workerProc{proc: newProc(c.t, c.dir, "worker-"+id, env, "worker", "--id", id), id: id}
	w.restart()
	return w
}

// restart starts a new incarnation of the worker (the previous one must
// have exited) and waits until it pulls.
func (w *workerProc) restart() {
	w.t.Helper()
	w.start()
	line := w.waitLog(startTimeout, startedRE)
	w.owner = startedRE.FindStringSubmatch(line)[1]
}

// API types of the HTTP adapter (DESIGN §10).

type acceptResp struct {
	SessionKey string `json:"session_key"`
	Seq        uint64 `json:"seq"`
	Duplicate  bool   `json:"duplicate"`
}

type reply struct {
	Seq       uint64 `json:"seq"`
	TurnID    string `json:"turn_id"`
	SessionID string `json:"session_id"`
	Text      string `json:"text"`
	Kind      string `json:"kind"`
}

type apiErr struct {
	Error string `json:"error"`
}

// do sends one request to the ingress and returns the status and body.
func (c *cluster) do(method, path, contentType string, body []byte) (int, http.Header, []byte, error) {
	return c.doCtx(context.Background(), method, path, contentType, body)
}

func (c *cluster) doCtx(ctx context.Context, method, path, contentType string, body []byte) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 80*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.httpBase+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, data, err
}

// post sends POST /v1/messages and requires 202.
func (c *cluster) post(chatID, text, messageID string) acceptResp {
	c.t.Helper()
	a, err := c.tryPost(chatID, text, messageID)
	if err != nil {
		c.t.Fatal(err)
	}
	return a
}

func (c *cluster) tryPost(chatID, text, messageID string) (acceptResp, error) {
	return c.tryPostCtx(context.Background(), chatID, text, messageID)
}

func (c *cluster) tryPostCtx(ctx context.Context, chatID, text, messageID string) (acceptResp, error) {
	req := map[string]string{"chat_id": chatID, "text": text, "user_id": "u-" + chatID}
	if messageID != "" {
		req["message_id"] = messageID
	}
	body, _ := json.Marshal(req)
	status, _, data, err := c.doCtx(ctx, http.MethodPost, "/v1/messages", "application/json", body)
	if err != nil {
		return acceptResp{}, fmt.Errorf("POST /v1/messages %s: %w", chatID, err)
	}
	if status != http.StatusAccepted {
		return acceptResp{}, fmt.Errorf("POST /v1/messages %s: %d %s", chatID, status, data)
	}
	var a acceptResp
	if err := json.Unmarshal(data, &a); err != nil {
		return acceptResp{}, fmt.Errorf("POST /v1/messages %s: %w: %s", chatID, err, data)
	}
	if a.SessionKey == "" || a.Seq == 0 {
		return acceptResp{}, fmt.Errorf("POST /v1/messages %s: incomplete answer %s", chatID, data)
	}
	return a, nil
}

// replies reads one page of a lane's mailbox after seq, waiting up to wait
// for the first reply when there is none.
func (c *cluster) replies(key string, after uint64, wait time.Duration) ([]reply, error) {
	q := url.Values{"after": {strconv.FormatUint(after, 10)}}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	status, _, data, err := c.do(http.MethodGet, "/v1/sessions/"+url.PathEscape(key)+"/replies?"+q.Encode(), "", nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET replies of %s: %d %s", key, status, data)
	}
	var r struct {
		Replies []reply `json:"replies"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("GET replies of %s: %w: %s", key, err, data)
	}
	return r.Replies, nil
}

// allReplies reads a lane's whole mailbox, page by page.
func (c *cluster) allReplies(key string) []reply {
	c.t.Helper()
	out, err := c.tryAllReplies(key)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// tryAllReplies reads a lane's whole mailbox; a failed read (the API
// answers 503 "retry" while the cluster recovers from a lost node) is
// returned, as is a mailbox out of order.
func (c *cluster) tryAllReplies(key string) ([]reply, error) {
	var out []reply
	var after uint64
	for {
		page, err := c.replies(key, after, 0)
		if err != nil {
			return nil, err
		}
		if len(page) == 0 {
			return out, nil
		}
		for _, r := range page {
			if r.Seq <= after {
				return nil, fmt.Errorf("replies of %s: seq %d after %d: mailbox out of order", key, r.Seq, after)
			}
			after = r.Seq
		}
		out = append(out, page...)
	}
}

// waitReplies long-polls a lane's mailbox until it holds at least n replies.
func (c *cluster) waitReplies(key string, n int, timeout time.Duration) []reply {
	c.t.Helper()
	var got []reply
	var after uint64
	waitFor(c.t, timeout, fmt.Sprintf("%d replies of %s", n, key), func() error {
		page, err := c.replies(key, after, 2*time.Second)
		if err != nil {
			return err
		}
		for _, r := range page {
			after = r.Seq
		}
		got = append(got, page...)
		if len(got) < n {
			return fmt.Errorf("%d replies so far: %+v", len(got), got)
		}
		return nil
	})
	return got
}

// entry reads a lane's SessionEntry from the sessions bucket.
func (c *cluster) entry(key string) (*session.SessionEntry, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, _, err := c.store.Get(ctx, session.LaneToken(key))
	return e, err
}

// mustEntry is entry that fails the test on an error.
func (c *cluster) mustEntry(key string) *session.SessionEntry {
	c.t.Helper()
	e, err := c.entry(key)
	if err != nil {
		c.t.Fatal(err)
	}
	return e
}

// load reads a session's transcript.
func (c *cluster) load(sessionID string) []transcript.Entry {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	entries, _, err := c.tx.Load(ctx, sessionID)
	if err != nil {
		c.t.Fatalf("load transcript %s: %v", sessionID, err)
	}
	return entries
}

// committed reports nil once the lane has committed seq with no turn in
// flight.
func (c *cluster) committed(key string, seq uint64) error {
	e, err := c.entry(key)
	if err != nil {
		return err
	}
	switch {
	case e.InboxID != c.res.InboxID:
		return fmt.Errorf("%s: inbox id %q, want %q", key, e.InboxID, c.res.InboxID)
	case e.CommittedSeq < seq:
		return fmt.Errorf("%s: committed_seq %d < %d (owner %q, turn %v)", key, e.CommittedSeq, seq, e.Owner, e.Turn != nil)
	case e.Turn != nil:
		return fmt.Errorf("%s: turn %s still in flight (owner %q)", key, e.Turn.ID, e.Owner)
	}
	return nil
}

// delivered reports nil once the http delivery consumer has copied every
// reply of the outbox into the mailboxes.
func (c *cluster) delivered() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := c.res.Outbox.Consumer(ctx, c.names.DeliveryConsumer(string(session.PlatformHTTP)))
	if err != nil {
		return err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return err
	}
	if info.NumPending != 0 || info.NumAckPending != 0 {
		return fmt.Errorf("delivery consumer: %d pending, %d unacked", info.NumPending, info.NumAckPending)
	}
	return nil
}

// inboxState returns the inbox stream's message count and last seq.
func (c *cluster) inboxState() (uint64, uint64) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.res.Inbox.Info(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	return info.State.Msgs, info.State.LastSeq
}

// turnEvents reads every TurnEvent stored so far, in stream order.
func (c *cluster) turnEvents() []worker.TurnEvent {
	c.t.Helper()
	msgs := c.readStream(c.res.Events, c.names.EventSubject("turn", ">"))
	out := make([]worker.TurnEvent, 0, len(msgs))
	for _, m := range msgs {
		var ev worker.TurnEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			c.t.Fatalf("undecodable turn event on %s: %v: %s", m.Subject, err, m.Data)
		}
		out = append(out, ev)
	}
	return out
}

// eventsOf reads the stored lifecycle events of kind, of every lane.
func (c *cluster) eventsOf(kind string) []*jetstream.RawStreamMsg {
	c.t.Helper()
	return c.readStream(c.res.Events, c.names.EventSubject(kind, ">"))
}

// readStream reads every stored message of a stream matching filter, in
// order, with an ordered consumer.
func (c *cluster) readStream(s jetstream.Stream, filter string) []*jetstream.RawStreamMsg {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		c.t.Fatalf("read %s: %v", filter, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		c.t.Fatalf("read %s: %v", filter, err)
	}
	var out []*jetstream.RawStreamMsg
	pending := info.NumPending
	for pending > 0 {
		batch, err := cons.Fetch(int(min(pending, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			c.t.Fatalf("read %s: %v", filter, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				c.t.Fatalf("read %s: %v", filter, err)
			}
			out = append(out, &jetstream.RawStreamMsg{Subject: m.Subject(), Sequence: md.Sequence.Stream, Header: m.Headers(), Data: m.Data(), Time: md.Timestamp})
			pending = md.NumPending
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			c.t.Fatalf("read %s: %v", filter, err)
		}
		if n == 0 {
			c.t.Fatalf("read %s: no progress with %d pending", filter, pending)
		}
	}
	return out
}

// replyEntries returns a transcript's assistant reply entries by turn id
// (an assistant message with text and no tool calls).
func replyEntries(entries []transcript.Entry) map[string][]transcript.Entry {
	out := map[string][]transcript.Entry{}
	for _, e := range entries {
		if e.Kind == transcript.KindMessage && e.Role == transcript.RoleAssistant && len(e.ToolCalls) == 0 && e.Content != "" {
			out[e.TurnID] = append(out[e.TurnID], e)
		}
	}
	return out
}

// turnEnds returns a transcript's turn_end entries by turn id.
func turnEnds(entries []transcript.Entry) map[string][]transcript.Entry {
	out := map[string][]transcript.Entry{}
	for _, e := range entries {
		if e.Kind == transcript.KindTurnEnd {
			out[e.TurnID] = append(out[e.TurnID], e)
		}
	}
	return out
}

// userEntries returns the effective user entries of a transcript.
func userEntries(entries []transcript.Entry) []transcript.Entry {
	var out []transcript.Entry
	for _, e := range transcript.Effective(entries) {
		if e.Role == transcript.RoleUser {
			out = append(out, e)
		}
	}
	return out
}

// checkRepliesOnce asserts that the mailbox holds every completed turn's
// reply exactly once, with the transcript's text, and nothing that no
// stored reply or notice entry accounts for. It returns the number of
// completed turns with a reply.
func checkRepliesOnce(t testing.TB, key string, entries []transcript.Entry, box []reply) int {
	t.Helper()
	seen := map[string]int{}
	byTurn := map[string][]reply{}
	for _, r := range box {
		k := r.TurnID + "\x00" + r.Kind + "\x00" + r.Text
		seen[k]++
		if seen[k] == 2 {
			t.Errorf("%s: reply delivered twice: turn %s kind %s text %q", key, r.TurnID, r.Kind, r.Text)
		}
		if r.Kind == session.ReplyKindReply {
			byTurn[r.TurnID] = append(byTurn[r.TurnID], r)
		}
	}
	replies := replyEntries(entries)
	ends := turnEnds(entries)
	completed := 0
	for turn, rs := range replies {
		if len(rs) > 1 {
			t.Errorf("%s: turn %s has %d assistant reply entries in the transcript", key, turn, len(rs))
		}
		st := ends[turn]
		if len(st) == 0 || st[len(st)-1].Status != transcript.StatusCompleted {
			continue
		}
		completed++
		got := byTurn[turn]
		switch {
		case len(got) == 0:
			t.Errorf("%s: completed turn %s: its reply %q was never delivered", key, turn, rs[0].Content)
		case len(got) > 1:
			t.Errorf("%s: completed turn %s: reply delivered %d times: %+v", key, turn, len(got), got)
		case got[0].Text != rs[0].Content:
			t.Errorf("%s: completed turn %s: delivered %q, transcript has %q", key, turn, got[0].Text, rs[0].Content)
		}
	}
	for turn, rs := range byTurn {
		if len(replies[turn]) == 0 {
			t.Errorf("%s: mailbox has a reply of turn %s with no reply entry in the transcript: %+v", key, turn, rs)
		}
	}
	for _, ends := range ends {
		if len(ends) > 1 {
			t.Errorf("%s: turn %s has %d turn_end entries", key, ends[0].TurnID, len(ends))
		}
	}
	return completed
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// inboxSettled reports nil once the workers consumer has nothing pending and
// nothing unacked: every delivery (redeliveries included) was handled.
func (c *cluster) inboxSettled() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.res.Consumer.Info(ctx)
	if err != nil {
		return err
	}
	if info.NumPending != 0 || info.NumAckPending != 0 {
		return fmt.Errorf("workers consumer: %d pending, %d unacked", info.NumPending, info.NumAckPending)
	}
	return nil
}

// turnsInFlight counts the lanes whose entry records a turn of owner.
func (c *cluster) turnsInFlight(owner string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lister, err := c.res.Sessions.ListKeys(ctx)
	if err != nil {
		return 0
	}
	n := 0
	for lane := range lister.Keys() {
		e, _, err := c.store.Get(ctx, lane)
		if err == nil && e.Owner == owner && e.Turn != nil {
			n++
		}
	}
	return n
}
