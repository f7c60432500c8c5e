package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

// Lease is what a lane's lease key holds.
type Lease struct {
	Owner    string    `json:"owner"`
	Epoch    uint64    `json:"epoch"`
	Revision uint64    `json:"revision"`
	TTL      string    `json:"ttl"`
	Renewed  time.Time `json:"renewed_at"`
	TTLLeft  string    `json:"ttl_left"`
}

// ReadLease reads the lane's live lease, or nil when no lease is held.
func (f *Fleet) ReadLease(ctx context.Context, lane string) (*Lease, error) {
	e, err := f.Res.Leases.Get(ctx, lane)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return DecodeLease(lane, e)
}

// DecodeLease decodes a lease key's value.
func DecodeLease(lane string, e jetstream.KeyValueEntry) (*Lease, error) {
	var v struct {
		Owner string `json:"owner"`
		Epoch uint64 `json:"epoch"`
		TTLMS int64  `json:"ttl_ms"`
	}
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return nil, fmt.Errorf("lease of %s: %w", lane, err)
	}
	ttl := time.Duration(v.TTLMS) * time.Millisecond
	d := &Lease{Owner: v.Owner, Epoch: v.Epoch, Revision: e.Revision(), TTL: ttl.String(), Renewed: e.Created()}
	if d.Epoch == 0 {
		d.Epoch = e.Revision() // a create's own revision is its epoch
	}
	// The server judges expiry; this is for display, from the server's
	// write time and this machine's clock.
	d.TTLLeft = max(0, time.Until(e.Created().Add(ttl))).Round(100 * time.Millisecond).String()
	return d, nil
}

// BreakOwner is the owner id of the placeholder lease BreakLease writes.
const BreakOwner = "fleetctl/break-lease"

// BreakLease forces a takeover: it replaces the lane's live lease, at the
// revision read, by a one-second lease of BreakOwner. Its owner's next
// renewal or fenced write is refused (the key no longer holds its lease);
// the server expires the placeholder with a MaxAge marker, which the
// fleet's expiry watch treats as any expired lease: it wakes the lane, and
// the worker that takes it creates a new lease at a higher revision, the
// new epoch that fences the old owner's transcript and entry writes. It
// returns the lease broken, or nil when none was held.
func (f *Fleet) BreakLease(ctx context.Context, lane string) (*Lease, error) {
	for attempt := 0; attempt < 5; attempt++ {
		cur, err := f.ReadLease(ctx, lane)
		if err != nil || cur == nil {
			return nil, err
		}
		if cur.Owner == BreakOwner {
			return cur, nil // broken already, not yet expired
		}
		data, _ := json.Marshal(map[string]any{"owner": BreakOwner, "ttl_ms": time.Second.Milliseconds()})
		msg := nats.NewMsg("$KV." + f.Names.LeasesBucket() + "." + lane)
		msg.Data = data
		_, err = f.JS.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(cur.Revision), jetstream.WithMsgTTL(time.Second))
		if err == nil {
			return cur, f.wakeAfterBreak(ctx, lane)
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			continue // renewed meanwhile: break the renewal
		}
		return nil, fmt.Errorf("break the lease of %s: %w", lane, err)
	}
	return nil, fmt.Errorf("break the lease of %s: it keeps changing; try again", lane)
}

// wakeAfterBreak waits for the server to expire the placeholder lease and
// then wakes the lane if it has work, with the wake-up the expiry watch
// sends (same Msg-Id, so the lane is woken once): the takeover does not
// depend on which worker leads the watch, nor on the old owner's
// deliveries coming back.
func (f *Fleet) wakeAfterBreak(ctx context.Context, lane string) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		cur, err := f.ReadLease(ctx, lane)
		if err != nil {
			return err
		}
		if cur != nil && cur.Owner != BreakOwner {
			return nil // taken over already
		}
		if cur == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lease broken; waiting for its expiry to wake the lane: %w", ctx.Err())
		case <-tick.C:
		}
	}
	e, _, err := f.Store.Get(ctx, lane)
	if err != nil {
		return err
	}
	stranded := e.Turn != nil
	if !stranded {
		in := f.inbox(ctx, lane)
		last, err := in.Stream.GetLastMsgForSubject(ctx, f.Names.InboxSubject(session.Partition(f.Names.Prefix(), lane), lane))
		stranded = err == nil && (e.InboxID != in.ID || last.Sequence > e.CommittedSeq)
	}
	if !stranded {
		return nil
	}
	body, err := json.Marshal(session.Inbound{SessionKey: e.SessionKey, Kind: session.KindInternal, Command: worker.WakeCommand, ReceivedAt: time.Now()})
	if err != nil {
		return err
	}
	msg := nats.NewMsg(f.Names.InboxSubject(session.Partition(f.Names.Prefix(), lane), lane))
	msg.Data = body
	msg.Header.Set(broker.HdrSessionKey, e.SessionKey)
	msg.Header.Set(broker.HdrKind, session.KindInternal)
	_, err = f.JS.PublishMsg(ctx, msg, append(broker.InboxPublishOptions(), jetstream.WithMsgID(worker.WakeMsgID(lane, e.CommittedSeq, e.LeaseEpoch)))...)
	return err
}
