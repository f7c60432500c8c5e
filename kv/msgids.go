package kv

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
)

// MsgIDs remembers which inbox message (seq and stream) incorporated a platform message id,
// for the longest platform retry horizon (the bucket's TTL). The stream's
// Msg-Id window is minutes; this is what makes a retry days later a duplicate.
type MsgIDs struct {
	kv jetstream.KeyValue
	// async, when set, sends the first create of ClaimAsync without
	// waiting for its PubAck.
	async jetstream.JetStream
}

// NewMsgIDs returns the msgids store.
func NewMsgIDs(res *broker.Resources) *MsgIDs { return &MsgIDs{kv: res.MsgIDs} }

// NewMsgIDsAsync is NewMsgIDs whose ClaimAsync sends its create through
// js's asynchronous publisher (js must time its acks out:
// jetstream.WithPublishAsyncTimeout).
func NewMsgIDsAsync(res *broker.Resources, js jetstream.JetStream) *MsgIDs {
	return &MsgIDs{kv: res.MsgIDs, async: js}
}

// Key is the bucket key of a platform message id.
func (m *MsgIDs) Key(platformMsgID string) string { return session.LaneToken(platformMsgID) }

// MsgRef names the inbox message that incorporated a platform message id:
// its seq and the identity (fleet_inbox_id) of the inbox stream the seq
// counts in. Two inbox streams use the same seqs, so a seq alone cannot tell
// a platform retry that landed in another stream (its partition moved) from
// the message itself.
type MsgRef struct {
	Seq uint64
	// Inbox is the stream's identity; "" in a record written before
	// records named their stream.
	Inbox string
}

// Same reports whether r and o name the same inbox message. A record that
// names no stream (written before) is judged by its seq alone, as it was
// then.
func (r MsgRef) Same(o MsgRef) bool {
	return r.Seq == o.Seq && (r.Inbox == "" || o.Inbox == "" || r.Inbox == o.Inbox)
}

// Encode is the stored form: "<seq> <inbox id>", or "<seq>" alone when the
// stream is not known (the form of older records).
func (r MsgRef) Encode() []byte {
	s := strconv.FormatUint(r.Seq, 10)
	if r.Inbox != "" {
		s += " " + r.Inbox
	}
	return []byte(s)
}

// ParseMsgRef reads a stored record, of either form.
func ParseMsgRef(b []byte) (MsgRef, error) {
	seq, inbox, _ := strings.Cut(string(b), " ")
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return MsgRef{}, fmt.Errorf("bad msgids record %q", b)
	}
	return MsgRef{Seq: n, Inbox: inbox}, nil
}

// Lookup returns the inbox seq recorded for id.
func (m *MsgIDs) Lookup(ctx context.Context, id string) (uint64, bool, error) {
	r, ok, err := m.Find(ctx, id)
	return r.Seq, ok, err
}

// Find returns the inbox message recorded for id.
func (m *MsgIDs) Find(ctx context.Context, id string) (MsgRef, bool, error) {
	e, err := m.kv.Get(ctx, m.Key(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return MsgRef{}, false, nil
	}
	if err != nil {
		return MsgRef{}, false, err
	}
	r, err := ParseMsgRef(e.Value())
	if err != nil {
		return MsgRef{}, false, fmt.Errorf("msgid %s: %w", id, err)
	}
	return r, true, nil
}

// Renew writes the record of id again, with value (the record's own), if it
// is still at revision rev (the one read): the record's age, which the
// bucket's TTL counts, starts again. A record rewritten or removed since it
// was read is left as it is, and that is no error.
func (m *MsgIDs) Renew(ctx context.Context, id string, value []byte, rev uint64) error {
	if _, err := m.kv.Update(ctx, m.Key(id), value, rev); err != nil && !isConflict(err) {
		return fmt.Errorf("renew msgid %s: %w", id, err)
	}
	return nil
}

// Claim claims id for the inbox message ref. It returns the message that
// owns the id: ref itself, or an earlier one when the id was already
// incorporated (a duplicate; compare with MsgRef.Same). It is idempotent:
// claiming the same id for the same message again returns it.
func (m *MsgIDs) Claim(ctx context.Context, id string, ref MsgRef) (MsgRef, error) {
	for attempt := 1; ; attempt++ {
		_, err := m.kv.Create(ctx, m.Key(id), ref.Encode())
		if err == nil {
			return ref, nil
		}
		if !isConflict(err) {
			return MsgRef{}, fmt.Errorf("record msgid %s: %w", id, err)
		}
		owner, ok, err := m.Find(ctx, id)
		if err != nil {
			return MsgRef{}, err
		}
		if ok {
			return owner, nil
		}
		// A conflict with no record: the claim expired between the two
		// calls, or (an R3 bucket during a leader change) the create was
		// refused as "wrong last sequence" while another write of the key
		// was in flight and never landed. Claim it again after a moment.
		if attempt >= recordAttempts {
			return MsgRef{}, fmt.Errorf("record msgid %s: create conflicts but no record is found (%d attempts; the store may be changing leader)",
				id, attempt)
		}
		t := time.NewTimer(time.Duration(attempt) * 100 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return MsgRef{}, fmt.Errorf("record msgid %s: %w", id, ctx.Err())
		}
	}
}

// PendingClaim is a Claim in flight (ClaimAsync).
type PendingClaim struct {
	m   *MsgIDs
	id  string
	ref MsgRef
	// fut is the create sent without waiting, nil when none was sent.
	fut jetstream.PubAckFuture

	once  sync.Once
	owner MsgRef
	err   error
}

// ClaimAsync starts Claim(id, ref) and returns at once; Wait gives its
// outcome. Its first create goes out without waiting for the PubAck (no
// goroutine of its own): a create that is acknowledged is the claim; any
// other outcome (the id is taken, an error, no answer in time) is settled
// by Claim in Wait, which is idempotent for the same id and message.
func (m *MsgIDs) ClaimAsync(id string, ref MsgRef) *PendingClaim {
	c := &PendingClaim{m: m, id: id, ref: ref}
	if m.async != nil {
		// A create: the header jetstream.WithExpectLastSequencePerSubject(0)
		// sets, without the option's allocations.
		msg := broker.NewMsg("$KV."+m.kv.Bucket()+"."+m.Key(id), ref.Encode(), jetstream.ExpectedLastSubjSeqHeader, "0")
		if fut, err := m.async.PublishMsgAsync(msg); err == nil {
			c.fut = fut
		}
	}
	return c
}

// Wait returns the message that owns the claimed id, as Claim does. It may
// be called from several goroutines and more than once.
func (c *PendingClaim) Wait(ctx context.Context) (MsgRef, error) {
	c.once.Do(func() {
		if c.fut != nil {
			select {
			case <-c.fut.Ok():
				c.owner = c.ref
				return
			case <-c.fut.Err():
			case <-ctx.Done():
				c.err = fmt.Errorf("record msgid %s: %w", c.id, ctx.Err())
				return
			}
		}
		c.owner, c.err = c.m.Claim(ctx, c.id, c.ref)
	})
	return c.owner, c.err
}

// recordAttempts bounds the create-then-lookup rounds of one Record.
const recordAttempts = 5
