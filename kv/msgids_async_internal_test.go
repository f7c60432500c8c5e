package kv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ClaimAsync settles a claim by Claim (a synchronous create) whenever its
// asynchronous create did not answer, so its outcome alone cannot tell
// whether the asynchronous path works at all. These tests watch both paths:
// the asynchronous publishes and the server's answers to them
// (asyncProbe), and the synchronous creates of the fallback (countingKV).

// countingKV counts the synchronous creates: one per claim that Wait had to
// settle by Claim.
type countingKV struct {
	jetstream.KeyValue
	creates atomic.Int32
}

func (c *countingKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	c.creates.Add(1)
	return c.KeyValue.Create(ctx, key, value, opts...)
}

// asyncAnswer is what the server (or the publisher's ack timeout) answered
// one asynchronous publish.
type asyncAnswer struct {
	msg *nats.Msg
	ack *jetstream.PubAck
	err error
}

// asyncProbe is the JetStream ClaimAsync publishes through. It passes each
// publish on and records the answer it got; publish, when set, replaces the
// real publish (a fault).
type asyncProbe struct {
	jetstream.JetStream
	publish func(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error)

	mu      sync.Mutex
	sent    int
	answers chan asyncAnswer
}

func newAsyncProbe(js jetstream.JetStream) *asyncProbe {
	return &asyncProbe{JetStream: js, answers: make(chan asyncAnswer, 64)}
}

func (p *asyncProbe) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	p.mu.Lock()
	p.sent++
	p.mu.Unlock()
	if p.publish != nil {
		return p.publish(m, opts...)
	}
	fut, err := p.JetStream.PublishMsgAsync(m, opts...)
	if err != nil {
		return nil, err
	}
	return p.observe(fut), nil
}

func (p *asyncProbe) published() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent
}

// observe returns a future that gives what fut gives, and records it in
// p.answers. Its goroutine ends when fut is answered, which the publisher's
// ack timeout bounds.
func (p *asyncProbe) observe(fut jetstream.PubAckFuture) jetstream.PubAckFuture {
	f := &fakeFuture{msg: fut.Msg(), ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	go func() {
		select {
		case ack := <-fut.Ok():
			p.answers <- asyncAnswer{msg: f.msg, ack: ack}
			f.ok <- ack
		case err := <-fut.Err():
			p.answers <- asyncAnswer{msg: f.msg, err: err}
			f.err <- err
		}
	}()
	return f
}

// answer waits for the answer to the next asynchronous publish.
func (p *asyncProbe) answer(t *testing.T) asyncAnswer {
	t.Helper()
	select {
	case a := <-p.answers:
		return a
	case <-time.After(60 * time.Second):
		t.Fatal("no answer to the asynchronous create within 60s")
		return asyncAnswer{}
	}
}

// fakeFuture is a PubAckFuture the test answers itself.
type fakeFuture struct {
	msg *nats.Msg
	ok  chan *jetstream.PubAck
	err chan error
}

func (f *fakeFuture) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *fakeFuture) Err() <-chan error            { return f.err }
func (f *fakeFuture) Msg() *nats.Msg               { return f.msg }

func failedFuture(m *nats.Msg, err error) *fakeFuture {
	f := &fakeFuture{msg: m, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	f.err <- err
	return f
}

// asyncMsgIDs is a MsgIDs whose asynchronous creates go through a probe and
// whose synchronous creates are counted.
func asyncMsgIDs(t *testing.T, a *ambEnv) (*MsgIDs, *asyncProbe, *countingKV) {
	t.Helper()
	ajs, err := jetstream.New(a.js.Conn(), jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	probe := newAsyncProbe(ajs)
	counted := &countingKV{KeyValue: a.res.MsgIDs}
	m := NewMsgIDsAsync(a.res, probe)
	m.kv = counted
	return m, probe, counted
}

// checkCreateMsg checks that an asynchronous create is the KV create of id
// for ref: the key's subject, the record, and the condition that makes it a
// create (no message on the subject yet).
func checkCreateMsg(t *testing.T, m *MsgIDs, msg *nats.Msg, id string, ref MsgRef) {
	t.Helper()
	if want := "$KV." + m.kv.Bucket() + "." + m.Key(id); msg.Subject != want {
		t.Errorf("asynchronous create on %q, want %q", msg.Subject, want)
	}
	if got, want := string(msg.Data), string(ref.Encode()); got != want {
		t.Errorf("asynchronous create carries %q, want %q", got, want)
	}
	if got := msg.Header.Get(jetstream.ExpectedLastSubjSeqHeader); got != "0" {
		t.Errorf("asynchronous create expects last subject seq %q, want \"0\" (a create)", got)
	}
}

// TestMsgIDsClaimAsync: a claim whose create is sent without waiting
// answers as Claim does: the first message owns the id (and the
// asynchronous create, acknowledged by the server, is what answered: no
// synchronous create ran), a later message gets the first's (the server
// refused its asynchronous create, the fallback read the owner), the same
// message again gets itself (idempotent), several waiters get one answer,
// and an id whose record was deleted is claimed again.
func TestMsgIDsClaimAsync(t *testing.T) {
	t.Parallel()
	a := newAmbEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	m, probe, syncKV := asyncMsgIDs(t, a)

	// claim runs one ClaimAsync and checks its answer, the asynchronous
	// create it sent and what the server said to it, and how many
	// synchronous creates the fallback ran.
	claim := func(id string, ref, want MsgRef, waiters int, acked bool) {
		t.Helper()
		sent, creates := probe.published(), syncKV.creates.Load()
		c := m.ClaimAsync(id, ref)
		var wg sync.WaitGroup
		for range waiters {
			wg.Go(func() {
				if got, err := c.Wait(ctx); err != nil || got != want {
					t.Errorf("ClaimAsync(%q, %+v).Wait = %+v, %v; want %+v", id, ref, got, err, want)
				}
			})
		}
		wg.Wait()
		if got := probe.published() - sent; got != 1 {
			t.Fatalf("ClaimAsync(%q, %+v) sent %d asynchronous creates, want 1", id, ref, got)
		}
		ans := probe.answer(t)
		checkCreateMsg(t, m, ans.msg, id, ref)
		fallback := syncKV.creates.Load() - creates
		if acked {
			if ans.err != nil || ans.ack == nil || ans.ack.Stream != "KV_"+m.kv.Bucket() {
				t.Errorf("ClaimAsync(%q, %+v): the asynchronous create got %+v, %v; want a PubAck of the bucket", id, ref, ans.ack, ans.err)
			}
			if fallback != 0 {
				t.Errorf("ClaimAsync(%q, %+v) ran %d synchronous creates, want none: the asynchronous create answered", id, ref, fallback)
			}
			return
		}
		if !isWrongLastSeq(ans.err) {
			t.Errorf("ClaimAsync(%q, %+v): the asynchronous create got %+v, %v; want the server's \"wrong last sequence\"", id, ref, ans.ack, ans.err)
		}
		if fallback != 1 {
			t.Errorf("ClaimAsync(%q, %+v) ran %d synchronous creates, want 1 (the fallback)", id, ref, fallback)
		}
	}

	for i := range 10 {
		id := fmt.Sprintf("telegram:-100123:%d", i)
		first := MsgRef{Seq: uint64(100 + i), Inbox: "stream-a"}
		// A fresh id: claimed by this message, three waiters, one answer.
		claim(id, first, first, 3, true)
		// A taken id: the answer names the first owner.
		claim(id, MsgRef{Seq: 9999, Inbox: "stream-a"}, first, 1, false)
		claim(id, MsgRef{Seq: first.Seq, Inbox: "stream-b"}, first, 1, false)
		// The same message again: itself.
		claim(id, first, first, 1, false)
		if r, ok, err := m.Find(ctx, id); err != nil || !ok || r != first {
			t.Errorf("Find(%q) = %+v, %v, %v; want %+v", id, r, ok, err, first)
		}
	}
	// A deleted record (a delete marker is the key's last message, so the
	// asynchronous create is refused) is claimed again by the next message,
	// through the fallback.
	id := "telegram:-100123:0"
	if err := a.res.MsgIDs.Delete(ctx, m.Key(id)); err != nil {
		t.Fatal(err)
	}
	next := MsgRef{Seq: 500, Inbox: "stream-a"}
	claim(id, next, next, 1, false)
	if r, ok, err := m.Find(ctx, id); err != nil || !ok || r != next {
		t.Errorf("Find(%q) after the claim over a delete = %+v, %v, %v; want %+v", id, r, ok, err, next)
	}
}

// TestMsgIDsClaimAsyncFallback: when the asynchronous create does not
// answer (the publish fails, its PubAck is lost whether or not it landed)
// Wait settles the claim by Claim, with the answer Claim gives; a Wait
// whose context ends first reports it and creates nothing.
func TestMsgIDsClaimAsyncFallback(t *testing.T) {
	t.Parallel()
	a := newAmbEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	errInjected := errors.New("injected publish failure")
	tests := []struct {
		name string
		// taken: another message owns the id before the claim.
		taken   bool
		publish func(p *asyncProbe) func(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error)
	}{
		{
			name: "publish fails, fresh id",
			publish: func(*asyncProbe) func(*nats.Msg, ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
				return func(*nats.Msg, ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) { return nil, errInjected }
			},
		},
		{
			name:  "publish fails, taken id",
			taken: true,
			publish: func(*asyncProbe) func(*nats.Msg, ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
				return func(*nats.Msg, ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) { return nil, errInjected }
			},
		},
		{
			name: "ack times out, nothing landed",
			publish: func(*asyncProbe) func(*nats.Msg, ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
				return func(m *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
					return failedFuture(m, jetstream.ErrAsyncPublishTimeout), nil
				}
			},
		},
		{
			// The create landed and its PubAck was lost: the fallback's
			// create conflicts with it and finds the claim is this
			// message's own.
			name: "ack lost, the create landed",
			publish: func(p *asyncProbe) func(*nats.Msg, ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
				return func(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
					fut, err := p.JetStream.PublishMsgAsync(m, opts...)
					if err != nil {
						return nil, err
					}
					select {
					case <-fut.Ok():
					case err := <-fut.Err():
						return nil, fmt.Errorf("the real create failed: %w", err)
					}
					return failedFuture(m, jetstream.ErrAsyncPublishTimeout), nil
				}
			},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, probe, syncKV := asyncMsgIDs(t, a)
			probe.publish = tc.publish(probe)
			id := fmt.Sprintf("http:fallback:%d", i)
			ref := MsgRef{Seq: uint64(10 + i), Inbox: "stream-a"}
			want := ref
			if tc.taken {
				want = MsgRef{Seq: 1, Inbox: "stream-a"}
				if _, err := a.res.MsgIDs.Create(ctx, m.Key(id), want.Encode()); err != nil {
					t.Fatal(err)
				}
			}
			before := lastSeq(ctx, t, a, m)
			got, err := m.ClaimAsync(id, ref).Wait(ctx)
			if err != nil || got != want {
				t.Errorf("ClaimAsync(%q, %+v).Wait = %+v, %v; want %+v", id, ref, got, err, want)
			}
			if n := probe.published(); n != 1 {
				t.Errorf("%d asynchronous creates tried, want 1", n)
			}
			if n := syncKV.creates.Load(); n != 1 {
				t.Errorf("%d synchronous creates, want 1 (the fallback)", n)
			}
			if r, ok, err := m.Find(ctx, id); err != nil || !ok || r != want {
				t.Errorf("Find(%q) = %+v, %v, %v; want %+v", id, r, ok, err, want)
			}
			// The claim wrote the bucket once when the id was fresh, not
			// at all when it was taken (the bucket keeps one message per
			// key, so its last seq counts the writes).
			wantWrites := uint64(1)
			if tc.taken {
				wantWrites = 0
			}
			if n := lastSeq(ctx, t, a, m) - before; n != wantWrites {
				t.Errorf("the claim wrote the bucket %d times, want %d", n, wantWrites)
			}
		})
	}

	t.Run("context ends before an answer", func(t *testing.T) {
		m, probe, syncKV := asyncMsgIDs(t, a)
		probe.publish = func(m *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
			return &fakeFuture{msg: m, ok: make(chan *jetstream.PubAck), err: make(chan error)}, nil
		}
		wctx, wcancel := context.WithCancel(ctx)
		wcancel()
		_, err := m.ClaimAsync("http:fallback:ctx", MsgRef{Seq: 1}).Wait(wctx)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Wait with an ended context = %v, want context.Canceled", err)
		}
		if n := syncKV.creates.Load(); n != 0 {
			t.Errorf("%d synchronous creates after the context ended, want none", n)
		}
		if _, err := a.res.MsgIDs.Get(ctx, m.Key("http:fallback:ctx")); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("record after an abandoned claim: %v, want none", err)
		}
	})
}

// lastSeq is the last seq of the msgids bucket's stream.
func lastSeq(ctx context.Context, t *testing.T, a *ambEnv, m *MsgIDs) uint64 {
	t.Helper()
	s, err := a.js.Stream(ctx, "KV_"+m.kv.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}
