package kv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
)

// Leases are per-lane exclusive leases in a bucket with per-key TTLs. The
// server judges expiry: a lease is a key created with a TTL and renewed by a
// conditional publish that carries a fresh TTL. No worker compares its clock
// with another's. The revision of the Create is the lease epoch: monotonic
// and never reused, it fences every owner-side write.
type Leases struct {
	kv      jetstream.KeyValue
	js      jetstream.JetStream
	bucket  string
	ttl     time.Duration
	timeout time.Duration
}

// Lease is one held lease.
type Lease struct {
	Lane  string
	Owner string
	// Epoch is the revision of the Create that took the lease.
	Epoch uint64
	// Rev is the revision of the latest renewal.
	Rev uint64
	// Renewed is the local monotonic time of the last confirmed write; the
	// owner stops itself once Renewed + TTL − margin has passed.
	Renewed time.Time
}

// leaseValue is what the lease key holds. A Create writes no epoch (its own
// revision is the epoch); a renewal writes the epoch it renews, so a later
// reader can tell a renewal of one lease from a new lease of the same owner.
type leaseValue struct {
	Owner string `json:"owner"`
	Epoch uint64 `json:"epoch,omitempty"`
	TTLMS int64  `json:"ttl_ms"`
}

// epochOf returns the epoch of the lease a key value at rev belongs to.
func (v leaseValue) epochOf(rev uint64) uint64 {
	if v.Epoch != 0 {
		return v.Epoch
	}
	return rev
}

// isOf reports whether the key value at rev belongs to lease (same owner,
// same epoch), whatever renewal of it the key holds.
func (v leaseValue) isOf(rev uint64, lease *Lease) bool {
	return v.Owner == lease.Owner && v.epochOf(rev) == lease.Epoch
}

// maxLeaseConflicts bounds how many conflicts Renew and Release resolve in
// one call; each is resolved by reading the key, so this only matters if the
// key keeps changing under a lease we still hold.
const maxLeaseConflicts = 8

// releaseMarkerTTL is how long the marker Release leaves behind lives; 1s is
// the server's floor and matches the leases bucket's LimitMarkerTTL.
const releaseMarkerTTL = time.Second

// NewLeases returns lane leases of the given TTL (at least 1s).
func NewLeases(js jetstream.JetStream, res *broker.Resources, names broker.Names, ttl time.Duration) *Leases {
	if ttl < time.Second {
		ttl = time.Second
	}
	return &Leases{kv: res.Leases, js: js, bucket: names.LeasesBucket(), ttl: ttl, timeout: DefaultWriteTimeout}
}

// TTL returns the lease TTL.
func (l *Leases) TTL() time.Duration { return l.ttl }

func (l *Leases) writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
}

// Acquire takes the lane's lease for owner. A lease held by anyone (owner
// included, e.g. a previous incarnation) gives a *HeldError. Only the server
// decides whether the lane is free: no local clock is consulted.
func (l *Leases) Acquire(ctx context.Context, lane, owner string) (*Lease, error) {
	data, _ := json.Marshal(leaseValue{Owner: owner, TTLMS: l.ttl.Milliseconds()})
	wctx, cancel := l.writeCtx(ctx)
	defer cancel()
	start := time.Now()
	rev, err := l.kv.Create(wctx, lane, data, jetstream.KeyTTL(l.ttl))
	if err == nil {
		return &Lease{Lane: lane, Owner: owner, Epoch: rev, Rev: rev, Renewed: start}, nil
	}
	if isConflict(err) {
		v, hrev, at, herr := l.valueAt(ctx, lane)
		if herr == nil {
			ttl := time.Duration(v.TTLMS) * time.Millisecond
			if ttl <= 0 {
				ttl = l.ttl
			}
			return nil, &HeldError{Lane: lane, Owner: v.Owner, Rev: hrev, Expires: at.Add(ttl)}
		}
		if errors.Is(herr, ErrNotFound) {
			// Expired between the two calls: the caller may simply retry.
			return nil, &HeldError{Lane: lane}
		}
		return nil, herr
	}
	if isAmbiguous(err) {
		v, hrev, herr := l.value(ctx, lane)
		if herr == nil && v.Owner == owner && v.Epoch == 0 {
			// Our create landed (a value without an epoch is a create, and
			// nobody else writes our owner id), unrenewed: its revision
			// is the epoch.
			return &Lease{Lane: lane, Owner: owner, Epoch: hrev, Rev: hrev, Renewed: start}, nil
		}
		return nil, fmt.Errorf("acquire lease %s: %w", lane, err)
	}
	return nil, fmt.Errorf("acquire lease %s: %w", lane, err)
}

// Renew extends the lease by a fresh TTL, only if the key still holds this
// lease (its owner and epoch). ErrLeaseLost means the lease expired or was
// taken, by another owner or by a new lease of the same owner. Any other
// error leaves the question open; the owner's self-fence decides.
//
// A conflict is resolved by reading the key, never by assuming the worst: an
// earlier renewal of ours whose ack was lost may have landed (the key holds
// our epoch at a higher revision: adopt it and renew again), or, on R3, the
// server refuses a write with 10164 while another write of the key is in
// flight, even one of ours (the key holds our epoch: try again).
func (l *Leases) Renew(ctx context.Context, lease *Lease) error {
	data, _ := json.Marshal(leaseValue{Owner: lease.Owner, Epoch: lease.Epoch, TTLMS: l.ttl.Milliseconds()})
	for attempt := 1; ; attempt++ {
		msg := nats.NewMsg("$KV." + l.bucket + "." + lease.Lane)
		msg.Data = data
		wctx, cancel := l.writeCtx(ctx)
		start := time.Now()
		ack, err := l.js.PublishMsg(wctx, msg, jetstream.WithExpectLastSequencePerSubject(lease.Rev), jetstream.WithMsgTTL(l.ttl))
		cancel()
		if err == nil {
			lease.Rev = ack.Sequence
			lease.Renewed = start
			return nil
		}
		if !isConflict(err) {
			return fmt.Errorf("renew lease %s: %w", lease.Lane, err)
		}
		if err := l.resolveConflict(ctx, lease, attempt, err); err != nil {
			return fmt.Errorf("renew lease %s: %w", lease.Lane, err)
		}
	}
}

// resolveConflict reads the lease key after a conditional write of lease
// failed with a conflict. It returns ErrLeaseLost when the key no longer
// holds the lease, nil when the write should be tried again (lease.Rev then
// names the key's current revision), or the conflict itself once attempts
// are used up.
func (l *Leases) resolveConflict(ctx context.Context, lease *Lease, attempt int, conflict error) error {
	v, rev, err := l.value(ctx, lease.Lane)
	if errors.Is(err, ErrNotFound) {
		return ErrLeaseLost
	}
	if err != nil {
		return err
	}
	if !v.isOf(rev, lease) {
		return ErrLeaseLost
	}
	if attempt >= maxLeaseConflicts {
		return conflict
	}
	if rev > lease.Rev {
		lease.Rev = rev
		return nil
	}
	// The key still shows our revision (or an older one, read from a
	// replica that lags): another write is in flight. Give it a moment.
	t := time.NewTimer(time.Duration(1+rand.IntN(2*attempt)) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Release deletes the lease if it is still this lease. A lease already gone,
// or taken by anyone else (a new lease of the same owner included), is left
// alone and Release returns nil.
//
// The lease is removed with a purge marker that itself expires (as the
// server's own expiry marker does), not a delete marker, which would stay in
// the bucket for good: one tombstone for every lane ever released.
func (l *Leases) Release(ctx context.Context, lease *Lease) error {
	for attempt := 1; ; attempt++ {
		wctx, cancel := l.writeCtx(ctx)
		err := l.kv.Purge(wctx, lease.Lane, jetstream.LastRevision(lease.Rev), jetstream.PurgeTTL(releaseMarkerTTL))
		cancel()
		if err == nil {
			return nil
		}
		if !isConflict(err) {
			return fmt.Errorf("release lease %s: %w", lease.Lane, err)
		}
		if err := l.resolveConflict(ctx, lease, attempt, err); err != nil {
			if errors.Is(err, ErrLeaseLost) {
				return nil
			}
			return fmt.Errorf("release lease %s: %w", lease.Lane, err)
		}
	}
}

// value reads the lane's live lease value and revision, or ErrNotFound.
func (l *Leases) value(ctx context.Context, laneTok string) (leaseValue, uint64, error) {
	v, rev, _, err := l.valueAt(ctx, laneTok)
	return v, rev, err
}

// valueAt is value plus the server's time of the lease's last write.
func (l *Leases) valueAt(ctx context.Context, laneTok string) (leaseValue, uint64, time.Time, error) {
	e, err := l.kv.Get(ctx, laneTok)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return leaseValue{}, 0, time.Time{}, ErrNotFound
	}
	if err != nil {
		return leaseValue{}, 0, time.Time{}, err
	}
	var v leaseValue
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return leaseValue{}, 0, time.Time{}, fmt.Errorf("lease %s: decode: %w", laneTok, err)
	}
	return v, e.Revision(), e.Created(), nil
}

// Holder returns the owner and revision of a live lease, or ErrNotFound.
func (l *Leases) Holder(ctx context.Context, laneTok string) (string, uint64, error) {
	v, rev, err := l.value(ctx, laneTok)
	if err != nil {
		return "", 0, err
	}
	return v.Owner, rev, nil
}

// Live returns the keys of the live leases (the watcher's own key among
// them): one watch of the last value per key, without values, skipping the
// delete, purge and expiry markers. Its size is the number of lanes owned
// right now, not the number of sessions.
func (l *Leases) Live(ctx context.Context) (map[string]struct{}, error) {
	watch, err := l.kv.WatchAll(ctx, jetstream.IgnoreDeletes(), jetstream.MetaOnly())
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	defer stopWatch(watch)
	held := map[string]struct{}{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-watch.Updates():
			if !ok {
				// Closed only by Stop or a closed connection: the list
				// is incomplete.
				return nil, errors.New("list leases: watch closed before the initial values were read")
			}
			if e == nil {
				return held, nil
			}
			held[e.Key()] = struct{}{}
		}
	}
}
