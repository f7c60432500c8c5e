package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestReadHistory: the minutes of the last hour count the turns that
// ended, the failed ones apart, with accept-to-reply latencies from the
// inbox; a turn still running is in the backlog of no ended minute.
func TestReadHistory(t *testing.T) {
	srv := natstest.RunServer(t)
	names := broker.MustNames("fleet")
	nc, wnc := srv.Connect(t), srv.Connect(t)
	js := natstest.JetStream(t, nc)
	if _, err := broker.Provision(t.Context(), js, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	wjs := natstest.JetStream(t, wnc)
	wres, err := broker.Provision(t.Context(), wjs, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(wnc, wjs, wres, worker.Config{ID: "hist-1", Names: names, Backend: echo.Backend(echo.Options{}),
		LeaseTTL: 3 * time.Second, LeaseMargin: 500 * time.Millisecond, PeekInterval: 100 * time.Millisecond, DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	fl, err := admin.Open(t.Context(), js, names)
	if err != nil {
		t.Fatal(err)
	}
	post := func(chat, text string) {
		src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: chat, ChatType: session.ChatDM, UserID: "u"}
		key := session.BuildSessionKey(src, session.DefaultKeyOptions())
		lane := session.LaneToken(key)
		data, _ := json.Marshal(session.Inbound{Source: src, SessionKey: key, Kind: session.KindMessage, Text: text, ReceivedAt: time.Now()})
		msg := nats.NewMsg(names.InboxSubject(session.Partition(names.Prefix(), lane), lane))
		msg.Data = data
		msg.Header.Set(broker.HdrSessionKey, key)
		msg.Header.Set(broker.HdrKind, session.KindMessage)
		if _, err := js.PublishMsg(t.Context(), msg); err != nil {
			t.Fatal(err)
		}
	}
	post("a", "one")
	post("b", "two")
	post("c", "!fail")

	var h *admin.History
	natstest.WaitFor(t, 60*time.Second, "three ended turns in the history", func() error {
		h, err = fl.ReadHistory(t.Context(), admin.HistoryOptions{})
		if err != nil {
			return err
		}
		turns := 0
		for _, m := range h.Minutes {
			turns += m.Turns
		}
		if turns != 3 {
			return fmt.Errorf("%d turns", turns)
		}
		return nil
	})
	if len(h.Minutes) != 60 || !h.To.After(time.Now()) || h.To.Sub(h.From) != time.Hour {
		t.Fatalf("window %s to %s, %d minutes", h.From, h.To, len(h.Minutes))
	}
	fails, sampled := 0, 0
	for _, m := range h.Minutes {
		fails += m.Failures
		if m.Turns > 0 {
			if m.P50 <= 0 || m.P50 > time.Minute || m.P99 < m.P50 {
				t.Fatalf("minute %s: p50 %s p99 %s", m.Start, m.P50, m.P99)
			}
			sampled++
		}
	}
	if fails != 1 || sampled == 0 {
		t.Fatalf("failures %d (want the !fail turn), minutes with latencies %d", fails, sampled)
	}
}
