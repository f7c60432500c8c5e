package kv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// An ambiguous write is one whose outcome the client does not learn: the
// request timed out, the connection dropped. It can't be provoked on demand
// against a healthy server (a context that is already done never sends the
// request, so it is not ambiguous at all), so these tests inject the fault at
// the jetstream.KeyValue boundary the Store and Leases write through, with
// the real server behind it:
//
//   - replyLost: the write really happens on the server, then the caller
//     gets a timeout, exactly what a lost PubAck looks like;
//   - notSent: the caller gets a timeout and nothing was written.
//
// Optionally a concurrent writer's update lands between the lost reply and
// the caller's read-back.
type fault int

const (
	none fault = iota
	replyLost
	notSent
)

type faultyKV struct {
	jetstream.KeyValue
	mu     sync.Mutex
	next   []fault // one per write call, then none
	writes int
	// after runs once after a replyLost write landed, before the timeout is
	// returned.
	after func()
}

func (f *faultyKV) take() fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes++
	if len(f.next) == 0 {
		return none
	}
	x := f.next[0]
	f.next = f.next[1:]
	return x
}

func (f *faultyKV) inject(write func() (uint64, error)) (uint64, error) {
	switch f.take() {
	case notSent:
		return 0, fmt.Errorf("injected: %w", nats.ErrTimeout)
	case replyLost:
		if _, err := write(); err != nil {
			return 0, err
		}
		if f.after != nil {
			f.after()
			f.after = nil
		}
		return 0, fmt.Errorf("injected: %w", context.DeadlineExceeded)
	}
	return write()
}

func (f *faultyKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	return f.inject(func() (uint64, error) { return f.KeyValue.Update(ctx, key, value, rev) })
}

func (f *faultyKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	return f.inject(func() (uint64, error) { return f.KeyValue.Create(ctx, key, value, opts...) })
}

type ambEnv struct {
	js  jetstream.JetStream
	res *broker.Resources
}

func newAmbEnv(t *testing.T) *ambEnv {
	t.Helper()
	srv := natstest.RunServer(t)
	js := natstest.JetStream(t, srv.Connect(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: broker.MustNames("fleet"), LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return &ambEnv{js: js, res: res}
}

// faultyStore is a Store whose session writes go through f; clean is a
// Store on the same buckets without faults.
func (a *ambEnv) faultyStore(f *faultyKV) (faulty, clean *Store) {
	clean = NewStore(a.res, &StoreOptions{WriteTimeout: 2 * time.Second})
	faulty = NewStore(a.res, &StoreOptions{WriteTimeout: 2 * time.Second})
	f.KeyValue = a.res.Sessions
	faulty.sessions = f
	return faulty, clean
}

func TestAmbiguousMutate(t *testing.T) {
	t.Parallel()
	a := newAmbEnv(t)
	ctx := t.Context()

	tests := []struct {
		name      string
		exists    bool
		faults    []fault
		wantCalls int
	}{
		{name: "update reply lost: the landed write is recognised", exists: true, faults: []fault{replyLost}, wantCalls: 1},
		{name: "update not sent: retried once", exists: true, faults: []fault{notSent}, wantCalls: 2},
		{name: "create reply lost: the landed write is recognised", faults: []fault{replyLost}, wantCalls: 1},
		{name: "create not sent: retried once", faults: []fault{notSent}, wantCalls: 2},
		{name: "two lost replies in a row", exists: true, faults: []fault{notSent, replyLost}, wantCalls: 2},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &faultyKV{}
			st, clean := a.faultyStore(f)
			lane := fmt.Sprintf("amb.mutate.%d", i)
			if tc.exists {
				if _, _, err := clean.Mutate(ctx, lane, nil, 0, nil, func(*session.SessionEntry) (*session.SessionEntry, error) {
					return &session.SessionEntry{SessionKey: "k", InputTokens: 10}, nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			f.next = tc.faults
			calls := 0
			e, rev, err := st.Mutate(ctx, lane, nil, 0, nil, func(e *session.SessionEntry) (*session.SessionEntry, error) {
				calls++
				if e == nil {
					e = &session.SessionEntry{SessionKey: "k", InputTokens: 10}
				}
				e.InputTokens++
				return e, nil
			})
			if err != nil {
				t.Fatalf("Mutate: %v", err)
			}
			if got, want := calls, tc.wantCalls; got != want {
				t.Errorf("fn ran %d times, want %d", got, want)
			}
			stored, srev, err := clean.Get(ctx, lane)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := stored.InputTokens, int64(11); got != want {
				t.Errorf("stored input_tokens = %d, want %d (applied exactly once)", got, want)
			}
			if rev != srev || e.InputTokens != 11 {
				t.Errorf("Mutate returned rev %d tokens %d, stored rev %d", rev, e.InputTokens, srev)
			}
		})
	}
}

// TestAmbiguousResetMintsOneSession: the reset's write landed but its reply
// was lost, and another write landed on top before the read-back, so the
// read-back can't recognise it and the mutation runs again. It must find the
// session it started and keep it, not start a second one whose parent is a
// session nobody indexed.
// TestAmbiguousAcquire: a lease Create whose reply was lost is recognised as
// ours, with the epoch the server gave it; one that was never sent leaves
// the lane free and reports the error.
func TestAmbiguousAcquire(t *testing.T) {
	t.Parallel()
	a := newAmbEnv(t)
	ctx := t.Context()
	names := broker.MustNames("fleet")
	f := &faultyKV{KeyValue: a.res.Leases}
	l := NewLeases(a.js, a.res, names, 5*time.Second)
	l.kv = f
	clean := NewLeases(a.js, a.res, names, 5*time.Second)

	f.next = []fault{replyLost}
	lease, err := l.Acquire(ctx, "amb.lease", "w/1")
	if err != nil {
		t.Fatalf("Acquire with a lost reply: %v", err)
	}
	owner, rev, err := clean.Holder(ctx, "amb.lease")
	if err != nil || owner != "w/1" || rev != lease.Epoch || lease.Rev != rev {
		t.Fatalf("holder %q at %d (%v); lease %+v", owner, rev, err, lease)
	}
	if err := l.Renew(ctx, lease); err != nil {
		t.Errorf("Renew of the recognised lease: %v", err)
	}

	f.next = []fault{notSent}
	if _, err := l.Acquire(ctx, "amb.lease2", "w/1"); err == nil || errors.As(err, new(*HeldError)) {
		t.Errorf("Acquire that was never sent: %v, want a plain error", err)
	}
	if _, _, err := clean.Holder(ctx, "amb.lease2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("lane after an unsent Acquire: %v, want free", err)
	}
}
