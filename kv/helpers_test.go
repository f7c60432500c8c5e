package kv_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// provisionTTL is the lease TTL given to broker.Provision (it only sizes the
// workers consumer's AckWait); lease tests choose their own lease TTL.
const provisionTTL = 3 * time.Second

var names = broker.MustNames("fleet")

// env is one embedded nats-server with the fleet provisioned on it.
type env struct {
	srv *natstest.Server
	js  jetstream.JetStream
	res *broker.Resources
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := natstest.RunServer(t)
	e := &env{srv: srv}
	e.js, e.res = e.connect(t)
	return e
}

// connect opens a new NATS connection of its own, with its own JetStream
// context and its own provisioned handles, as another process would.
func (e *env) connect(t *testing.T) (jetstream.JetStream, *broker.Resources) {
	t.Helper()
	return provisionOn(t, natstest.JetStream(t, e.srv.Connect(t)), 1)
}

func provisionOn(t *testing.T, js jetstream.JetStream, replicas int) (jetstream.JetStream, *broker.Resources) {
	t.Helper()
	// A fresh cluster can still refuse replicated assets for a moment ("no
	// suitable peers for placement, peer offline"), and on a loaded machine
	// an R3 create can wait out a stream group's election or lose its
	// answer: retry, each attempt bounded so one lost answer cannot eat the
	// whole wait.
	var res *broker.Resources
	natstest.WaitFor(t, 2*time.Minute, fmt.Sprintf("provisioning with %d replicas", replicas), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var err error
		res, err = broker.Provision(ctx, js, broker.ProvisionConfig{Names: names, LeaseTTL: provisionTTL, Replicas: replicas})
		return err
	})
	return js, res
}

// store returns a Store on a connection of its own, with clock now (nil =
// time.Now).
func (e *env) store(t *testing.T, now func() time.Time) *kv.Store {
	t.Helper()
	_, res := e.connect(t)
	return kv.NewStore(res, &kv.StoreOptions{Now: now})
}

// testCtx is a context bounded well below the go test timeout.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fakeClock is a settable clock for StoreOptions.Now.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock(t0 time.Time) *fakeClock { return &fakeClock{now: t0} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// t0 is the fixed start of the store clock in the session tests.
var t0 = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)

// src returns a Telegram DM source for chat id.
func src(chat string) session.SessionSource {
	return session.SessionSource{Platform: session.PlatformTelegram, ChatID: chat, ChatType: session.ChatDM, UserID: "u-" + chat, ChatName: "chat " + chat}
}

func keyOf(s session.SessionSource) string {
	return session.BuildSessionKey(s, session.DefaultKeyOptions())
}

func laneOf(s session.SessionSource) string { return session.LaneToken(keyOf(s)) }

// overwrite replaces the lane's entry (whatever its revision) and returns the
// new revision.
func overwrite(t *testing.T, st *kv.Store, lane string, e *session.SessionEntry) uint64 {
	t.Helper()
	_, rev, err := st.Mutate(context.Background(), lane, nil, 0, nil, func(*session.SessionEntry) (*session.SessionEntry, error) {
		return e.Clone(), nil
	})
	if err != nil {
		t.Fatalf("overwrite %s: %v", lane, err)
	}
	return rev
}

// edit applies fn to the lane's existing entry (unfenced) and returns it.
func edit(t *testing.T, st *kv.Store, lane string, fn func(e *session.SessionEntry)) *session.SessionEntry {
	t.Helper()
	e, _, err := st.Mutate(context.Background(), lane, nil, 0, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e == nil {
			return nil, errors.New("no entry to edit")
		}
		fn(e)
		return e, nil
	})
	if err != nil {
		t.Fatalf("edit %s: %v", lane, err)
	}
	return e
}

// mustGet reads the lane's entry and revision.
func mustGet(t *testing.T, st *kv.Store, lane string) (*session.SessionEntry, uint64) {
	t.Helper()
	e, rev, err := st.Get(context.Background(), lane)
	if err != nil {
		t.Fatalf("get %s: %v", lane, err)
	}
	return e, rev
}

// revOf returns the lane's revision, 0 when it has no entry.
func revOf(t *testing.T, st *kv.Store, lane string) uint64 {
	t.Helper()
	_, rev, err := st.Get(context.Background(), lane)
	if errors.Is(err, kv.ErrNotFound) {
		return 0
	}
	if err != nil {
		t.Fatalf("get %s: %v", lane, err)
	}
	return rev
}

// create makes the lane's first session at the store's clock, as the
// lane's owner does on its first turn.
func create(t *testing.T, st *kv.Store, s session.SessionSource) *session.SessionEntry {
	t.Helper()
	e, _, err := st.Mutate(context.Background(), laneOf(s), nil, 0, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
		if e != nil {
			return nil, fmt.Errorf("lane already has session %s", e.SessionID)
		}
		now := st.Now()
		e = &session.SessionEntry{SessionKey: keyOf(s), Platform: s.Platform, ChatType: s.ChatType, CostStatus: "unknown"}
		e.SetOrigin(s)
		e.StartSession(session.NewSessionID(now), "", now)
		return e, nil
	})
	if err != nil {
		t.Fatalf("create session for %s: %v", s.ChatID, err)
	}
	return e
}

func timePtr(t time.Time) *time.Time { return &t }
