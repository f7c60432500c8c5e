// Package admin is what fleetctl's admin commands and the operations
// console share: reading a fleet (lanes, leases, inbox backlogs, dead
// letters, the state database's fleet.api service) and acting on it through
// the lane protocol (commands published into a lane's inbox, dead-letter
// replay, lease breaking). It holds no state: every answer is read from the
// fleet's streams and buckets when asked.
package admin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/kv"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// Fleet is a connection bound to an existing fleet's streams and buckets.
type Fleet struct {
	NC    *nats.Conn
	JS    jetstream.JetStream
	Names broker.Names
	Res   *broker.Resources
	Store *kv.Store
	TX    *transcript.Log
}

// Open binds to an existing fleet without creating anything.
func Open(ctx context.Context, js jetstream.JetStream, names broker.Names) (*Fleet, error) {
	res, err := OpenResources(ctx, js, names)
	if err != nil {
		return nil, err
	}
	tx, err := transcript.New(js, names, nil)
	if err != nil {
		return nil, err
	}
	return &Fleet{NC: js.Conn(), JS: js, Names: names, Res: res, Store: kv.NewStore(res, nil), TX: tx}, nil
}

// OpenResources binds to an existing fleet's streams and buckets without
// creating anything.
func OpenResources(ctx context.Context, js jetstream.JetStream, n broker.Names) (*broker.Resources, error) {
	res := &broker.Resources{JS: js}
	var err error
	if res.Sessions, err = js.KeyValue(ctx, n.SessionsBucket()); err != nil {
		return nil, fmt.Errorf("sessions bucket %s: %w (is the fleet running and provisioned?)", n.SessionsBucket(), err)
	}
	if res.SessionIDs, err = js.KeyValue(ctx, n.SessionIDsBucket()); err != nil {
		return nil, fmt.Errorf("session-id bucket: %w", err)
	}
	if res.Leases, err = js.KeyValue(ctx, n.LeasesBucket()); err != nil {
		return nil, fmt.Errorf("leases bucket: %w", err)
	}
	if res.Workers, err = js.KeyValue(ctx, n.WorkersBucket()); err != nil {
		return nil, fmt.Errorf("workers bucket: %w", err)
	}
	if res.Transcripts, err = js.Stream(ctx, n.TranscriptStream()); err != nil {
		return nil, fmt.Errorf("transcript stream: %w", err)
	}
	if res.Inbox, err = js.Stream(ctx, n.InboxStream()); err != nil {
		return nil, fmt.Errorf("inbox stream: %w", err)
	}
	if res.Events, err = js.Stream(ctx, n.EventStream()); err != nil {
		return nil, fmt.Errorf("events stream: %w", err)
	}
	res.InboxID = res.Inbox.CachedInfo().Config.Metadata[broker.InboxIDMetadata]
	if res.Inboxes, err = broker.OpenInboxes(ctx, js, n, false); err != nil {
		return nil, err
	}
	return res, nil
}

// ResolveLane turns a session key, a lane or a session id into a lane.
func (f *Fleet) ResolveLane(ctx context.Context, arg string) (string, error) {
	if session.ValidSessionID(arg) {
		rec, err := f.Store.LookupIndex(ctx, arg)
		if err != nil {
			return "", err
		}
		return rec.Lane, nil
	}
	if strings.Contains(arg, ":") {
		return session.LaneToken(arg), nil
	}
	if _, err := session.ParseLaneToken(arg); err == nil {
		return arg, nil
	}
	return "", fmt.Errorf("%q is not a session key, lane or session id", arg)
}

// InboxBacklog counts what waits in a lane's inbox after seq: the /queue
// items and all messages (queue items, plain messages, commands).
func (f *Fleet) InboxBacklog(ctx context.Context, lane string, after uint64) (queued, pending int, err error) {
	filter := f.Names.InboxLaneFilter(lane)
	for seq := after + 1; ; {
		raw, err := f.inbox(ctx, lane).Stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return queued, pending, nil
		}
		if err != nil {
			return queued, pending, err
		}
		pending++
		if raw.Header.Get(broker.HdrKind) == session.KindQueue {
			queued++
		}
		seq = raw.Sequence + 1
	}
}

// LaneBacklog is InboxBacklog after what the lane's entry committed (all of
// the lane's inbox when the entry is of another inbox incarnation).
func (f *Fleet) LaneBacklog(ctx context.Context, lane string, e *session.SessionEntry) (queued, pending int, err error) {
	after := uint64(0)
	if e != nil && e.InboxID == f.inbox(ctx, lane).ID {
		after = e.CommittedSeq
	}
	return f.InboxBacklog(ctx, lane, after)
}

// Commands are the lane commands an operator may send, by their name in
// the lane protocol.
var Commands = []string{session.CmdStop, session.CmdReset, session.CmdSuspend, session.CmdResumePending, session.CmdBusy}

// BusyModes are the arguments of the busy command.
var BusyModes = []string{"interrupt", "queue", "steer"}

// CheckCommand says whether command with args may be sent to a lane.
func CheckCommand(command, args string) error {
	switch command {
	case session.CmdStop, session.CmdReset, session.CmdSuspend, session.CmdResumePending:
		if args != "" {
			return fmt.Errorf("command %s takes no argument", command)
		}
		return nil
	case session.CmdBusy:
		if args != "interrupt" && args != "queue" && args != "steer" {
			return fmt.Errorf("busy mode %q: want interrupt, queue or steer", args)
		}
		return nil
	}
	return fmt.Errorf("command %q: want one of %s", command, strings.Join(Commands, ", "))
}

// PublishCommand publishes command into the lane's inbox, so that the
// lane's owner applies it in order with the messages around it, exactly
// as if the user had typed it. It returns the inbox sequence.
func (f *Fleet) PublishCommand(ctx context.Context, lane, command, args string) (uint64, error) {
	e, _, err := f.Store.Get(ctx, lane)
	if err != nil {
		return 0, err
	}
	in := session.Inbound{SessionKey: e.SessionKey, Kind: session.KindCommand, Command: command, Args: args, ReceivedAt: time.Now()}
	if o, ok := e.OriginSource(); ok {
		in.Source = o
	}
	data, err := json.Marshal(in)
	if err != nil {
		return 0, err
	}
	msg := nats.NewMsg(f.Names.InboxSubject(session.Partition(f.Names.Prefix(), lane), lane))
	msg.Data = data
	msg.Header.Set(broker.HdrSessionKey, e.SessionKey)
	msg.Header.Set(broker.HdrKind, session.KindCommand)
	var b [8]byte
	_, _ = rand.Read(b[:])
	ack, err := f.JS.PublishMsg(ctx, msg, append(broker.InboxPublishOptions(), jetstream.WithMsgID("admin:"+hex.EncodeToString(b[:])))...)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// ErrNoStateDB is returned by Call when no state database answers.
var ErrNoStateDB = errors.New("no state database answers")

// Call sends one request to the state database's micro service (fleet.api)
// and decodes the answer into resp.
func (f *Fleet) Call(ctx context.Context, endpoint string, req, resp any) error {
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	subj := f.Names.APISubject(endpoint)
	m, err := f.NC.RequestWithContext(ctx, subj, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("%w on %s: run `agentfleet indexer --db FILE` (or `agentfleet up`)", ErrNoStateDB, subj)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", subj, err)
	}
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
		return fmt.Errorf("%s: %s (%s)", endpoint, m.Header.Get(micro.ErrorHeader), code)
	}
	if err := json.Unmarshal(m.Data, resp); err != nil {
		return fmt.Errorf("%s: undecodable answer: %w", endpoint, err)
	}
	return nil
}

// WorkersBacklog sums the workers consumers of every inbox stream: the
// deliveries not yet handed out and those handed out and not acked.
func (f *Fleet) WorkersBacklog(ctx context.Context) (pending, ackPending uint64, err error) {
	return broker.WorkersBacklog(ctx, f.Res.Inboxes, f.Names)
}

// inbox is the inbox stream of lane, from a map read at most a second ago (a
// console runs for days; a migration may have moved the lane's partition).
func (f *Fleet) inbox(ctx context.Context, lane string) *broker.Inbox {
	return f.Res.Inboxes.Fresh(ctx, time.Second).ForLane(lane)
}
