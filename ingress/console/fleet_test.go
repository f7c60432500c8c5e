package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/statedb"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

const adminToken = "console-test-token"

// testFleet is a fleet in this process: an embedded NATS server, one
// worker with the echo agent, the indexer with its fleet.api service, and
// an ingress whose HTTP server serves the console.
type testFleet struct {
	t     *testing.T
	names broker.Names
	js    jetstream.JetStream
	res   *broker.Resources
	fl    *admin.Fleet
	url   string // the ingress's base URL
}

func startFleet(t *testing.T) *testFleet {
	t.Helper()
	srv := natstest.RunServer(t)
	names := broker.MustNames("fleet")
	provision := func(nc *nats.Conn) (jetstream.JetStream, *broker.Resources) {
		js := natstest.JetStream(t, nc)
		res, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return js, res
	}
	f := &testFleet{t: t, names: names}
	f.js, f.res = provision(srv.Connect(t))
	fl, err := admin.Open(t.Context(), f.js, names)
	if err != nil {
		t.Fatal(err)
	}
	f.fl = fl

	// The connections close after the worker and the indexer stop
	// (cleanups run last first).
	wnc, inc, hnc := srv.Connect(t), srv.Connect(t), srv.Connect(t)
	// Every provisioning is done before anything runs: nats-server's race
	// detector reports a stream update (a provisioning) racing a consumer
	// creation (the worker's, the indexer's) in the server itself.
	wjs, wres := provision(wnc)
	_, ires := provision(inc)
	hjs, hres := provision(hnc)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	w, err := worker.New(wnc, wjs, wres, worker.Config{ID: "console-w1", Version: "1.0.0-test", Names: names, Backend: echo.Backend(echo.Options{}),
		LeaseTTL: 3 * time.Second, LeaseMargin: 500 * time.Millisecond, Linger: 30 * time.Second, PeekInterval: 100 * time.Millisecond,
		DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := w.Run(ctx); err != nil {
			t.Errorf("worker: %v", err)
		}
	}()

	db, err := statedb.Open(t.Context(), filepath.Join(t.TempDir(), "state.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ix, err := statedb.NewIndexer(ires, db, statedb.IndexerConfig{Names: names})
	if err != nil {
		t.Fatal(err)
	}
	api, err := statedb.StartAPI(inc, db, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := ix.Run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("indexer: %v", err)
		}
		_ = api.Stop()
		_ = db.Close()
	}()

	in, err := ingress.New(hjs, hres, ingress.Config{Names: names, KeyOptions: session.DefaultKeyOptions(), Token: adminToken,
		EventsHeartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(in.Handler())
	t.Cleanup(func() { in.Close(); hs.CloseClientConnections(); hs.Close() })
	f.url = hs.URL
	return f
}

// post sends a user message through the ingress's HTTP API and returns its
// lane and inbox seq.
func (f *testFleet) post(chatID, text string) (string, uint64) {
	f.t.Helper()
	body, _ := json.Marshal(map[string]string{"chat_id": chatID, "text": text, "user_id": "u-" + chatID})
	req, _ := http.NewRequest(http.MethodPost, f.url+"/v1/messages", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		SessionKey string `json:"session_key"`
		Seq        uint64 `json:"seq"`
	}
	if resp.StatusCode != http.StatusAccepted || json.NewDecoder(resp.Body).Decode(&out) != nil {
		f.t.Fatalf("POST /v1/messages: %s", resp.Status)
	}
	return session.LaneToken(out.SessionKey), out.Seq
}

// postSource publishes a message with a source of its own straight into
// the inbox (as an adapter would), for what the HTTP API's bounds refuse.
func (f *testFleet) postSource(chatID, text string, edit func(*session.SessionSource)) (string, uint64) {
	f.t.Helper()
	src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chatID, ChatType: session.ChatDM, UserID: "u-" + chatID}
	edit(&src)
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	lane := session.LaneToken(key)
	in := session.Inbound{Source: src, SessionKey: key, Kind: session.KindMessage, Text: text, ReceivedAt: time.Now()}
	data, _ := json.Marshal(in)
	msg := nats.NewMsg(f.names.InboxSubject(session.Partition(f.names.Prefix(), lane), lane))
	msg.Data = data
	msg.Header.Set(broker.HdrSessionKey, key)
	msg.Header.Set(broker.HdrKind, session.KindMessage)
	ack, err := f.js.PublishMsg(f.t.Context(), msg)
	if err != nil {
		f.t.Fatal(err)
	}
	return lane, ack.Sequence
}

// waitEntry waits for the lane's entry to satisfy ok.
func (f *testFleet) waitEntry(lane, what string, ok func(*session.SessionEntry) error) *session.SessionEntry {
	f.t.Helper()
	var e *session.SessionEntry
	natstest.WaitFor(f.t, 60*time.Second, what, func() error {
		var err error
		if e, _, err = f.fl.Store.Get(f.t.Context(), lane); err != nil {
			return err
		}
		return ok(e)
	})
	return e
}

// waitCommitted waits for the lane to have committed seq with no turn in
// flight.
func (f *testFleet) waitCommitted(lane string, seq uint64) *session.SessionEntry {
	f.t.Helper()
	return f.waitEntry(lane, fmt.Sprintf("%s to commit %d", lane, seq), func(e *session.SessionEntry) error {
		if e.CommittedSeq < seq || e.Turn != nil {
			return fmt.Errorf("committed %d, turn %v", e.CommittedSeq, e.Turn != nil)
		}
		return nil
	})
}

// get fetches a console page with the admin token.
func (f *testFleet) get(path string, hdr ...string) (*http.Response, string) {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.url+path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp, b.String()
}

type consoleEntry = session.SessionEntry

var errNotYet = fmt.Errorf("not yet")
