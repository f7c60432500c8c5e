package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

// TestUpSIGTERM runs the all-in-one `agentfleet up`, gets a reply over the
// long poll, then stops it with SIGTERM while a turn runs: the process must
// exit 0 promptly, and a second `up` on the same data directory must deliver
// the reply of the turn that was draining exactly once, in the same session.
func TestUpSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	t.Parallel()
	dir := t.TempDir()
	addr := freeAddr(t)
	base := "http://" + addr
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	env := []string{"AGENTFLEET_SESSION_RESET_MODE=none", "AGENTFLEET_AGENT_RESTART_DRAIN_TIMEOUT=10s"}
	up := newProc(t, dir, "up", env, "up", "--data", dir+"/data", "--http", addr)

	call := func(method, path string, body any) (int, []byte) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			data, _ := json.Marshal(body)
			rd = bytes.NewReader(data)
		}
		req, _ := http.NewRequestWithContext(context.Background(), method, base+path, rd)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, data
	}
	post := func(text string) acceptResp {
		t.Helper()
		status, data := call(http.MethodPost, "/v1/messages", map[string]string{"chat_id": "up-1", "text": text})
		var a acceptResp
		if status != http.StatusAccepted || json.Unmarshal(data, &a) != nil {
			t.Fatalf("POST: %d %s", status, data)
		}
		return a
	}
	longPoll := func(key string, after uint64, n int) []reply {
		t.Helper()
		var got []reply
		waitFor(t, 30*time.Second, fmt.Sprintf("%d replies of %s after %d", n, key, after), func() error {
			status, data := call(http.MethodGet, fmt.Sprintf("/v1/sessions/%s/replies?after=%d&wait=5s", key, after), nil)
			if status != http.StatusOK {
				return fmt.Errorf("replies: %d %s", status, data)
			}
			var r struct{ Replies []reply }
			if err := json.Unmarshal(data, &r); err != nil {
				return err
			}
			for _, x := range r.Replies {
				after = x.Seq
			}
			got = append(got, r.Replies...)
			if len(got) < n {
				return fmt.Errorf("%d replies", len(got))
			}
			return nil
		})
		return got
	}
	stop := func() {
		t.Helper()
		start := time.Now()
		up.signal(syscall.SIGTERM)
		st := up.waitExit(30 * time.Second)
		if st == nil {
			t.Fatalf("agentfleet up still runs %v after SIGTERM", time.Since(start))
		}
		if !st.Success() {
			t.Fatalf("agentfleet up exited with %v after SIGTERM, want 0", st)
		}
		t.Logf("agentfleet up exited 0 %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	}

	// First run: a reply over the long poll, then SIGTERM during a turn.
	t0 := time.Now()
	up.start()
	waitReady(t, hc, base, up)
	t.Logf("agentfleet up ready in %v", time.Since(t0).Round(time.Millisecond))
	a1 := post("hello up")
	t1 := time.Now()
	r1 := longPoll(a1.SessionKey, 0, 1)
	t.Logf("first reply after %v: %+v", time.Since(t1).Round(time.Millisecond), r1[0])
	if r1[0].Text != "echo: hello up" || r1[0].Kind != session.ReplyKindReply {
		t.Fatalf("first reply %+v, want echo: hello up", r1[0])
	}
	sid := r1[0].SessionID

	a2 := post("draining\n!sleep 1500ms")
	waitFor(t, 20*time.Second, "the second turn to run", func() error {
		status, data := call(http.MethodGet, "/v1/sessions/"+a2.SessionKey, nil)
		var e session.SessionEntry
		if status != http.StatusOK || json.Unmarshal(data, &e) != nil {
			return fmt.Errorf("session: %d %s", status, data)
		}
		if e.Turn == nil || e.Turn.LastSeq < a2.Seq {
			return fmt.Errorf("no turn for seq %d yet (committed %d)", a2.Seq, e.CommittedSeq)
		}
		return nil
	})
	stop()

	// Second run on the same data: the drained turn's reply, exactly once.
	up.start()
	waitReady(t, hc, base, up)
	all := longPoll(a1.SessionKey, 0, 2)
	status, data := call(http.MethodGet, "/v1/sessions/"+a1.SessionKey, nil)
	var e session.SessionEntry
	if status != http.StatusOK || json.Unmarshal(data, &e) != nil {
		t.Fatalf("session: %d %s", status, data)
	}
	if e.SessionID != sid {
		t.Errorf("session id changed across the restart: %s, then %s", sid, e.SessionID)
	}
	var texts []string
	for _, r := range all {
		if r.SessionID != sid {
			t.Errorf("reply %+v in session %s, want %s", r, r.SessionID, sid)
		}
		texts = append(texts, r.Text)
	}
	if got, want := strings.Join(texts, "|"), "echo: hello up|echo: draining"; got != want {
		t.Errorf("mailbox after restart %q, want %q", got, want)
	}
	stop()
}

// TestDedupOverHTTP posts one platform message id three times: one inbox
// message, one turn, one user entry, one reply.
func TestDedupOverHTTP(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.startIngress()
	c.startWorker("w1")
	c.startWorker("w2")

	a1 := c.post("dedup-1", "only once", "m-1")
	a2 := c.post("dedup-1", "only once", "m-1")
	if a1.Duplicate || !a2.Duplicate || a2.Seq != a1.Seq || a2.SessionKey != a1.SessionKey {
		t.Fatalf("first %+v, retry %+v: want the retry to be a duplicate with the same seq", a1, a2)
	}
	c.waitReplies(a1.SessionKey, 1, 30*time.Second)
	waitFor(t, 30*time.Second, "the turn to commit and its reply to be delivered", func() error {
		if err := c.committed(a1.SessionKey, a1.Seq); err != nil {
			return err
		}
		return c.delivered()
	})
	// A retry after the turn (and with another text) is still the same message.
	a3 := c.post("dedup-1", "only once, edited", "m-1")
	if !a3.Duplicate || a3.Seq != a1.Seq {
		t.Fatalf("late retry %+v: want a duplicate of seq %d", a3, a1.Seq)
	}

	if msgs, _ := c.inboxState(); msgs != 1 {
		t.Errorf("inbox holds %d messages, want 1", msgs)
	}
	e := c.mustEntry(a1.SessionKey)
	entries := c.load(e.SessionID)
	users := userEntries(entries)
	if len(users) != 1 || users[0].Content != "only once" || users[0].InboxSeq != a1.Seq {
		t.Errorf("user entries %+v, want one for seq %d", users, a1.Seq)
	}
	box := c.allReplies(a1.SessionKey)
	if len(box) != 1 || box[0].Text != "echo: only once" {
		t.Errorf("mailbox %+v, want one reply", box)
	}
	checkRepliesOnce(t, a1.SessionKey, entries, box)
	starts := 0
	for _, ev := range c.turnEvents() {
		if ev.Type == "start" {
			starts++
		}
	}
	if starts != 1 {
		t.Errorf("%d turns started, want 1", starts)
	}
}

// TestBadInputPublishesNothing sends malformed requests to the ingress
// process: each gets a 4xx with a JSON error, and the inbox is unchanged.
// A valid message at the end shows the count would have moved.
func TestBadInputPublishesNothing(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.startIngress()
	msgs0, last0 := c.inboxState()

	big := `{"chat_id":"x","text":"` + strings.Repeat("a", 1<<20+16) + `"}`
	cases := []struct {
		name, method, path, body string
		status                   int
	}{
		{"broken json", "POST", "/v1/messages", `{"chat_id":"x","text":`, 400},
		{"empty body", "POST", "/v1/messages", ``, 400},
		{"not an object", "POST", "/v1/messages", `[1,2]`, 400},
		{"no text", "POST", "/v1/messages", `{"chat_id":"x"}`, 400},
		{"blank text", "POST", "/v1/messages", `{"chat_id":"x","text":"  "}`, 400},
		{"no chat id", "POST", "/v1/messages", `{"text":"hi"}`, 400},
		{"unknown field", "POST", "/v1/messages", `{"chat_id":"x","text":"hi","bogus":1}`, 400},
		{"wrong type", "POST", "/v1/messages", `{"chat_id":5,"text":"hi"}`, 400},
		{"two objects", "POST", "/v1/messages", `{"chat_id":"x","text":"hi"} {"chat_id":"y","text":"hi"}`, 400},
		{"unknown platform", "POST", "/v1/messages", `{"chat_id":"x","text":"hi","platform":"myspace"}`, 400},
		{"bad chat type", "POST", "/v1/messages", `{"chat_id":"x","text":"hi","chat_type":"party"}`, 400},
		{"path in chat id", "POST", "/v1/messages", `{"chat_id":"a/../b","text":"hi"}`, 400},
		{"too large", "POST", "/v1/messages", big, 413},
		{"wrong method", "GET", "/v1/messages", ``, 405},
		{"bad session key", "GET", "/v1/sessions/not-a-key/replies", ``, 400},
		{"bad after", "GET", "/v1/sessions/agent:main:http:dm:x/replies?after=-1", ``, 400},
		{"bad wait", "GET", "/v1/sessions/agent:main:http:dm:x/replies?wait=soon", ``, 400},
	}
	for _, tc := range cases {
		status, hdr, data, err := c.do(tc.method, tc.path, "application/json", []byte(tc.body))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var e apiErr
		ct, _, _ := mime.ParseMediaType(hdr.Get("Content-Type"))
		switch {
		case status != tc.status:
			t.Errorf("%s: status %d, want %d: %.200s", tc.name, status, tc.status, data)
		case ct != "application/json":
			t.Errorf("%s: Content-Type %q, want application/json", tc.name, hdr.Get("Content-Type"))
		case json.Unmarshal(data, &e) != nil || e.Error == "":
			t.Errorf("%s: body %.200q is not a JSON error", tc.name, data)
		default:
			t.Logf("%s: %d %s", tc.name, status, e.Error)
		}
	}
	if msgs, last := c.inboxState(); msgs != msgs0 || last != last0 {
		t.Errorf("bad input changed the inbox: %d messages (last seq %d), was %d (%d)", msgs, last, msgs0, last0)
	}

	a := c.post("x", "a good one", "")
	if msgs, last := c.inboxState(); msgs != msgs0+1 || last != a.Seq {
		t.Errorf("a good message: inbox %d messages (last seq %d), want %d (%d)", msgs, last, msgs0+1, a.Seq)
	}
}
