package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// DeadLetter is one dead-lettered inbox message.
type DeadLetter struct {
	Seq        uint64          `json:"seq"`
	Lane       string          `json:"lane"`
	InboxSeq   uint64          `json:"inbox_seq"`
	SessionID  string          `json:"session_id"`
	TurnID     string          `json:"turn_id"`
	Reason     string          `json:"reason"`
	At         time.Time       `json:"at"`
	Message    session.Inbound `json:"message"`
	SessionKey string          `json:"session_key"`
}

func (f *Fleet) decodeDeadLetter(raw *jetstream.RawStreamMsg) (DeadLetter, bool) {
	prefix := f.Names.Prefix() + ".dlq."
	if len(raw.Subject) <= len(prefix) || raw.Subject[:len(prefix)] != prefix {
		return DeadLetter{}, false
	}
	d := DeadLetter{Seq: raw.Sequence, Lane: raw.Subject[len(prefix):], At: raw.Time,
		SessionID: raw.Header.Get(broker.HdrSessionID), TurnID: raw.Header.Get(broker.HdrTurnID), Reason: raw.Header.Get(broker.HdrReason),
		SessionKey: raw.Header.Get(broker.HdrSessionKey)}
	d.InboxSeq, _ = strconv.ParseUint(raw.Header.Get(broker.HdrInboxSeq), 10, 64)
	_ = json.Unmarshal(raw.Data, &d.Message)
	return d, true
}

// DeadLetterFilter is the subject filter of every dead letter (lane "") or
// of one lane's.
func (f *Fleet) DeadLetterFilter(lane string) string {
	if lane == "" {
		return f.Names.DeadLetterWildcard()
	}
	return f.Names.DeadLetterSubject(lane)
}

// DeadLetters reads the dead letters on filter (DeadLetterFilter), oldest
// first.
func (f *Fleet) DeadLetters(ctx context.Context, filter string) ([]DeadLetter, error) {
	var out []DeadLetter
	seq := uint64(1)
	for {
		raw, err := f.Res.Events.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if d, ok := f.decodeDeadLetter(raw); ok {
			out = append(out, d)
		}
		seq = raw.Sequence + 1
	}
}

// DeadLetter reads the dead letter at seq of the events stream.
func (f *Fleet) DeadLetter(ctx context.Context, seq uint64) (DeadLetter, *jetstream.RawStreamMsg, error) {
	raw, err := f.Res.Events.GetMsg(ctx, seq)
	if err != nil {
		return DeadLetter{}, nil, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	d, ok := f.decodeDeadLetter(raw)
	if !ok {
		return DeadLetter{}, nil, fmt.Errorf("message %d is not a dead letter", seq)
	}
	return d, raw, nil
}

// Replayed is the outcome of ReplayDeadLetter.
type Replayed struct {
	Replayed  uint64 `json:"replayed"`
	InboxSeq  uint64 `json:"inbox_seq"`
	Duplicate bool   `json:"duplicate"`
	Lane      string `json:"lane"`
}

// ReplayDeadLetter publishes the dead-lettered message at seq into its
// lane's inbox again. The replay is a new message: its platform id already
// belongs to the dead-lettered one, so it is dropped; the replay:<seq>
// Msg-Id keeps a replay from running twice (a second one is a duplicate).
func (f *Fleet) ReplayDeadLetter(ctx context.Context, seq uint64) (Replayed, error) {
	d, raw, err := f.DeadLetter(ctx, seq)
	if err != nil {
		return Replayed{}, err
	}
	d.Message.PlatformMsgID = ""
	body, err := json.Marshal(d.Message)
	if err != nil {
		return Replayed{}, err
	}
	msg := nats.NewMsg(f.Names.InboxSubject(session.Partition(f.Names.Prefix(), d.Lane), d.Lane))
	msg.Data = body
	msg.Header.Set(broker.HdrSessionKey, d.SessionKey)
	kind := raw.Header.Get(broker.HdrKind)
	if kind == "" {
		kind = session.KindMessage
	}
	msg.Header.Set(broker.HdrKind, kind)
	ack, err := f.JS.PublishMsg(ctx, msg, append(broker.InboxPublishOptions(), jetstream.WithMsgID(fmt.Sprintf("replay:%d", seq)))...)
	if err != nil {
		return Replayed{}, err
	}
	return Replayed{Replayed: seq, InboxSeq: ack.Sequence, Duplicate: ack.Duplicate, Lane: d.Lane}, nil
}

// PurgeDeadLetter deletes the dead letter at seq.
func (f *Fleet) PurgeDeadLetter(ctx context.Context, seq uint64) error {
	if _, _, err := f.DeadLetter(ctx, seq); err != nil {
		return err
	}
	if err := f.Res.Events.DeleteMsg(ctx, seq); err != nil {
		return fmt.Errorf("delete dead letter %d: %w", seq, err)
	}
	return nil
}

// PurgeDeadLetters deletes every dead letter of one lane, or all of them
// (lane ""), and returns how many it deleted.
func (f *Fleet) PurgeDeadLetters(ctx context.Context, lane string) (uint64, error) {
	filter := f.DeadLetterFilter(lane)
	dls, err := f.DeadLetters(ctx, filter)
	if err != nil {
		return 0, err
	}
	if len(dls) > 0 {
		if err := f.Res.Events.Purge(ctx, jetstream.WithPurgeSubject(filter)); err != nil {
			return 0, err
		}
	}
	return uint64(len(dls)), nil
}
