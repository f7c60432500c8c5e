package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/agent/echo"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestMigrateInboxR3ClusterUnderLoad: on a three-node cluster with R3
// inbox streams, two workers and lanes that keep posting (each lane's next
// message after the previous one was stored, retried with the same message
// id while its partition is closed), the fleet goes from 1 to 3 inbox
// streams and back to 1. Every lane's transcript then holds exactly the
// messages it posted, once each, in order, and no inbox stream holds a
// partition it is not assigned.
func TestMigrateInboxR3ClusterUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-node cluster under load")
	}
	c := natstest.RunCluster(t, 3)
	names := broker.MustNames("fleet")
	nc := c.Connect(t)
	js := natstest.JetStream(t, nc)
	pc := broker.ProvisionConfig{Names: names, Replicas: 3, LeaseTTL: 3 * time.Second}
	natstest.WaitFor(t, 2*time.Minute, "R3 provisioning", func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		_, err := broker.Provision(ctx, js, pc)
		return err
	})
	fl, err := admin.Open(t.Context(), js, names)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { wcancel(); wg.Wait() })
	for i := range 2 {
		wnc := c.Connect(t)
		wjs := natstest.JetStream(t, wnc)
		wres, err := broker.Provision(t.Context(), wjs, pc)
		if err != nil {
			t.Fatal(err)
		}
		w, err := worker.New(wnc, wjs, wres, worker.Config{ID: fmt.Sprintf("r3-%d", i), Names: names, Backend: echo.Backend(echo.Options{}),
			LeaseTTL: 3 * time.Second, LeaseMargin: 500 * time.Millisecond, PeekInterval: 100 * time.Millisecond, DrainTimeout: 2 * time.Second,
			Linger: 500 * time.Millisecond, Reset: session.ResetConfig{Default: session.ResetPolicy{Mode: session.ResetNone}}})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(wctx) }()
	}

	// The lanes post until told to stop.
	const lanes = 8
	type laneState struct {
		key, lane string
		sent      []string
	}
	ls := make([]*laneState, lanes)
	stop := make(chan struct{})
	var posters sync.WaitGroup
	errs := make(chan error, lanes)
	for i := range ls {
		src := session.SessionSource{Platform: session.PlatformHTTP, ChatID: fmt.Sprintf("r3-%d", i), ChatType: session.ChatDM, UserID: "u"}
		key := session.BuildSessionKey(src, session.DefaultKeyOptions())
		l := &laneState{key: key, lane: session.LaneToken(key)}
		ls[i] = l
		pnc := c.Connect(t)
		pjs := natstest.JetStream(t, pnc)
		posters.Add(1)
		go func() {
			defer posters.Done()
			p := session.Partition(names.Prefix(), l.lane)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				text := fmt.Sprintf("r3-%d-%d", i, n)
				data, _ := json.Marshal(session.Inbound{Source: src, SessionKey: key, Kind: session.KindMessage, Text: text,
					PlatformMsgID: "http:" + text, ReceivedAt: time.Now()})
				msg := nats.NewMsg(names.InboxSubject(p, l.lane))
				msg.Data = data
				msg.Header.Set(broker.HdrSessionKey, key)
				msg.Header.Set(broker.HdrKind, session.KindMessage)
				// Retried as the ingress does, with the same message id (a
				// retry while the first copy is still being stored is
				// refused as "in process": retried again).
				deadline := time.Now().Add(60 * time.Second)
				var err error
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					_, err = pjs.PublishMsg(ctx, msg, append(broker.InboxPublishOptions(), jetstream.WithMsgID("http:"+text))...)
					cancel()
					if err == nil || time.Now().After(deadline) {
						break
					}
					<-time.After(100 * time.Millisecond)
				}
				if err != nil {
					errs <- fmt.Errorf("lane %d: post %s: %w", i, text, err)
					return
				}
				l.sent = append(l.sent, text)
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
	}
	stopped := false
	stopPosting := func() {
		if !stopped {
			stopped = true
			close(stop)
			posters.Wait()
		}
	}
	t.Cleanup(stopPosting)

	<-time.After(500 * time.Millisecond) // traffic flowing before the move
	for _, target := range []int{3, 1} {
		rep, err := fl.MigrateInbox(t.Context(), target, admin.MigrateOptions{DrainTimeout: 90 * time.Second})
		if err != nil {
			t.Fatalf("migrate to %d: %v", target, err)
		}
		t.Logf("%d -> %d streams: %d partitions moved in %s (longest drain %s)", rep.From, rep.To, rep.Moved, rep.Took, rep.Drain)
	}
	stopPosting()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}

	for _, l := range ls {
		if len(l.sent) == 0 {
			t.Fatalf("lane %s posted nothing", l.lane)
		}
		natstest.WaitFor(t, 2*time.Minute, "lane "+l.lane+" to incorporate every message", func() error {
			e, _, err := fl.Store.Get(t.Context(), l.lane)
			if err != nil {
				return err
			}
			if e.Turn != nil {
				return fmt.Errorf("turn in flight")
			}
			entries, _, err := fl.TX.Load(t.Context(), e.SessionID)
			if err != nil {
				return err
			}
			var users []string
			for _, e := range entries {
				if e.Role == "user" {
					users = append(users, e.Content)
				}
			}
			if len(users) < len(l.sent) {
				return fmt.Errorf("%d of %d messages incorporated", len(users), len(l.sent))
			}
			if !slices.Equal(users, l.sent) {
				t.Fatalf("lane %s: transcript users %q, want exactly %q", l.lane, users, l.sent)
			}
			return nil
		})
	}
	total := 0
	for _, l := range ls {
		total += len(l.sent)
	}
	t.Logf("%d lanes, %d messages, each incorporated once, in order", lanes, total)
	m, _, err := broker.ReadInboxMap(t.Context(), mustBucketJS(t, js, names))
	if err != nil {
		t.Fatal(err)
	}
	if m.Streams != 1 || m.Migrating() {
		t.Fatalf("final map %s", m)
	}
}

func mustBucketJS(t *testing.T, js jetstream.JetStream, names broker.Names) jetstream.KeyValue {
	t.Helper()
	b, err := js.KeyValue(t.Context(), names.InboxMapBucket())
	if err != nil {
		t.Fatal(err)
	}
	return b
}
