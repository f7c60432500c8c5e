package kv

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// MsgIDs remembers which inbox sequence incorporated a platform message id,
// for the longest platform retry horizon (the bucket's TTL). The stream's
// Msg-Id window is minutes; this is what makes a retry days later a duplicate.
type MsgIDs struct {
	kv jetstream.KeyValue
	// async, when set, sends the first create of a Claim without waiting
	// for its PubAck (see RecordAsync).
	async jetstream.JetStream
}

// NewMsgIDs returns the msgids store.
func NewMsgIDs(res *broker.Resources) *MsgIDs { return &MsgIDs{kv: res.MsgIDs} }

// NewMsgIDsAsync is NewMsgIDs whose RecordAsync sends its create through
// js's asynchronous publisher (js must time its acks out:
// jetstream.WithPublishAsyncTimeout).
func NewMsgIDsAsync(res *broker.Resources, js jetstream.JetStream) *MsgIDs {
	return &MsgIDs{kv: res.MsgIDs, async: js}
}

// Key is the bucket key of a platform message id.
func (m *MsgIDs) Key(platformMsgID string) string { return session.LaneToken(platformMsgID) }

// Lookup returns the inbox seq recorded for id.
func (m *MsgIDs) Lookup(ctx context.Context, id string) (uint64, bool, error) {
	e, err := m.kv.Get(ctx, m.Key(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	seq, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("msgid %s: bad value %q", id, e.Value())
	}
	return seq, true, nil
}

// Record claims id for seq. It returns the seq that owns the id: seq itself,
// or an earlier one when the id was already incorporated (a duplicate). It is
// idempotent: recording the same id and seq again returns seq.
func (m *MsgIDs) Record(ctx context.Context, id string, seq uint64) (uint64, error) {
	for attempt := 1; ; attempt++ {
		_, err := m.kv.Create(ctx, m.Key(id), []byte(strconv.FormatUint(seq, 10)))
		if err == nil {
			return seq, nil
		}
		if !isConflict(err) {
			return 0, fmt.Errorf("record msgid %s: %w", id, err)
		}
		owner, ok, err := m.Lookup(ctx, id)
		if err != nil {
			return 0, err
		}
		if ok {
			return owner, nil
		}
		// A conflict with no record: the claim expired between the two
		// calls, or (an R3 bucket during a leader change) the create was
		// refused as "wrong last sequence" while another write of the key
		// was in flight and never landed. Claim it again after a moment.
		if attempt >= recordAttempts {
			return 0, fmt.Errorf("record msgid %s: create conflicts but no record is found (%d attempts; the store may be changing leader)",
				id, attempt)
		}
		t := time.NewTimer(time.Duration(attempt) * 100 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, fmt.Errorf("record msgid %s: %w", id, ctx.Err())
		}
	}
}

// Claim is a Record in flight (RecordAsync).
type Claim struct {
	m   *MsgIDs
	id  string
	seq uint64
	// fut is the create sent without waiting, nil when none was sent.
	fut jetstream.PubAckFuture

	once  sync.Once
	owner uint64
	err   error
}

// RecordAsync starts Record(id, seq) and returns at once; Wait gives its
// outcome. Its first create goes out without waiting for the PubAck (no
// goroutine of its own): a create that is acknowledged is the claim; any
// other outcome (the id is taken, an error, no answer in time) is settled
// by Record in Wait, which is idempotent for the same id and seq.
func (m *MsgIDs) RecordAsync(id string, seq uint64) *Claim {
	c := &Claim{m: m, id: id, seq: seq}
	if m.async != nil {
		msg := nats.NewMsg("$KV." + m.kv.Bucket() + "." + m.Key(id))
		msg.Data = strconv.AppendUint(nil, seq, 10)
		if fut, err := m.async.PublishMsgAsync(msg, jetstream.WithExpectLastSequencePerSubject(0)); err == nil {
			c.fut = fut
		}
	}
	return c
}

// Wait returns the seq that owns the claimed id, as Record does. It may be
// called from several goroutines and more than once.
func (c *Claim) Wait(ctx context.Context) (uint64, error) {
	c.once.Do(func() {
		if c.fut != nil {
			select {
			case <-c.fut.Ok():
				c.owner = c.seq
				return
			case <-c.fut.Err():
			case <-ctx.Done():
				c.err = fmt.Errorf("record msgid %s: %w", c.id, ctx.Err())
				return
			}
		}
		c.owner, c.err = c.m.Record(ctx, c.id, c.seq)
	})
	return c.owner, c.err
}

// recordAttempts bounds the create-then-lookup rounds of one Record.
const recordAttempts = 5
