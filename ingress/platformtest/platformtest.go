// Package platformtest holds what the tests of every platform adapter
// share: a provisioned fleet on an embedded NATS server with a Publisher,
// readers of the inbox and of the delivery-failure events, a way to put a
// reply into the outbox as a worker does, and a running PlatformDelivery.
package platformtest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// Timeout bounds every wait of the helpers.
const Timeout = 30 * time.Second

// Env is a provisioned fleet for one test.
type Env struct {
	t     testing.TB
	JS    jetstream.JetStream
	Res   *broker.Resources
	Names broker.Names
	Pub   *ingress.Publisher
}

// New starts an embedded server, provisions the fleet (prefix "fleet") and
// makes a Publisher with the default key options.
func New(t testing.TB) *Env {
	t.Helper()
	ns := natstest.RunServer(t)
	nc := ns.Connect(t)
	js := natstest.JetStream(t, nc)
	names := broker.MustNames("fleet")
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	res, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: names})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	pub, err := ingress.NewPublisher(js, res, ingress.Config{Names: names, KeyOptions: session.DefaultKeyOptions()})
	if err != nil {
		t.Fatal(err)
	}
	return &Env{t: t, JS: js, Res: res, Names: names, Pub: pub}
}

// Inbox returns every inbox message, in order.
func (e *Env) Inbox() []session.Inbound {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	info, err := e.Res.Inbox.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []session.Inbound
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := e.Res.Inbox.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			e.t.Fatal(err)
		}
		var in session.Inbound
		if err := json.Unmarshal(m.Data, &in); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, in)
	}
	return out
}

// Failures returns the delivery_failed events, in order.
func (e *Env) Failures() []ingress.DeliveryFailure {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	var out []ingress.DeliveryFailure
	for seq := uint64(1); ; {
		raw, err := e.Res.Events.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(e.Names.DeliveryFailedWildcard()))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			e.t.Fatal(err)
		}
		var f ingress.DeliveryFailure
		if err := json.Unmarshal(raw.Data, &f); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, f)
		seq = raw.Sequence + 1
	}
}

// PublishReply puts a reply to a DM chat (in thread, when not empty) of
// platform into the outbox, as a worker does, with id as its Msg-Id.
func (e *Env) PublishReply(platform session.Platform, id, chat, thread, text string) {
	e.t.Helper()
	src := session.SessionSource{Platform: platform, ChatID: chat, ChatType: session.ChatDM, ThreadID: thread}
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	rep := session.Reply{ID: id, SessionKey: key, SessionID: "20261123_120000_abcdef01", Kind: session.ReplyKindReply, Text: text,
		Platform: platform, ChatID: chat, ThreadID: thread, CreatedAt: time.Now().UTC()}
	data, _ := json.Marshal(rep)
	msg := nats.NewMsg(e.Names.OutboxSubject(string(platform), session.LaneToken(key)))
	msg.Data = data
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if _, err := e.JS.PublishMsg(ctx, msg, jetstream.WithMsgID(id)); err != nil {
		e.t.Fatal(err)
	}
}

// StartDelivery runs a PlatformDelivery of cfg until the test ends, with
// the env's names, no per-chat pacing and a 50ms first backoff (mod may
// change any of it).
func (e *Env) StartDelivery(cfg ingress.PlatformDeliveryConfig, mod func(*ingress.PlatformDeliveryConfig)) {
	e.t.Helper()
	cfg.Names = e.Names
	cfg.ChatInterval = 0
	cfg.Backoff = 50 * time.Millisecond
	if mod != nil {
		mod(&cfg)
	}
	d, err := ingress.NewPlatformDelivery(e.JS, e.Res, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(d.Stop)
}

// PublishTurnReply is PublishReply of a reply of turn turnID.
func (e *Env) PublishTurnReply(platform session.Platform, id, turnID, chat, thread, text string) {
	e.t.Helper()
	src := session.SessionSource{Platform: platform, ChatID: chat, ChatType: session.ChatDM, ThreadID: thread}
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	rep := session.Reply{ID: id, SessionKey: key, SessionID: "20261123_120000_abcdef01", TurnID: turnID, Kind: session.ReplyKindReply,
		Text: text, Platform: platform, ChatID: chat, ThreadID: thread, CreatedAt: time.Now().UTC()}
	data, _ := json.Marshal(rep)
	msg := nats.NewMsg(e.Names.OutboxSubject(string(platform), session.LaneToken(key)))
	msg.Data = data
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if _, err := e.JS.PublishMsg(ctx, msg, jetstream.WithMsgID(id)); err != nil {
		e.t.Fatal(err)
	}
}

// PutSession stores the session entry of a DM chat (in thread, when not
// empty) of platform with its origin, as a worker does at a turn's start,
// and returns the session key.
func (e *Env) PutSession(platform session.Platform, chat, thread string) string {
	e.t.Helper()
	src := session.SessionSource{Platform: platform, ChatID: chat, ChatType: session.ChatDM, ThreadID: thread}
	key := session.BuildSessionKey(src, session.DefaultKeyOptions())
	entry := session.SessionEntry{SessionKey: key, SessionID: "20261123_120000_abcdef01"}
	entry.SetOrigin(src)
	data, _ := json.Marshal(entry)
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if _, err := e.Res.Sessions.Put(ctx, session.LaneToken(key), data); err != nil {
		e.t.Fatal(err)
	}
	return key
}

// Delta publishes delta n of attempt 1 of turnID on the lane of key, as a
// streaming agent's worker does (core NATS).
func (e *Env) Delta(key, turnID string, n int, text string) {
	e.t.Helper()
	data, _ := json.Marshal(session.Delta{SessionKey: key, SessionID: "20261123_120000_abcdef01", TurnID: turnID, Attempt: 1, N: n, Text: text})
	nc := e.JS.Conn()
	if err := nc.Publish(e.Names.DeltaSubject(session.LaneToken(key)), data); err != nil {
		e.t.Fatal(err)
	}
	if err := nc.FlushTimeout(Timeout); err != nil {
		e.t.Fatal(err)
	}
}

// StartLive runs a LiveEdits of cfg until the test ends, with the env's
// names (mod may change any of it).
func (e *Env) StartLive(cfg ingress.LiveEditsConfig, mod func(*ingress.LiveEditsConfig)) {
	e.t.Helper()
	cfg.Names = e.Names
	if mod != nil {
		mod(&cfg)
	}
	l, err := ingress.NewLiveEdits(e.JS, e.Res, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	stop, err := l.Start(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(stop)
}
