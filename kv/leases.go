package kv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
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
	// Live is the epoch of the owner's liveness lease the lease is bound
	// to, 0 when unbound.
	Live uint64
	// TookOver is set when the lease was taken over from an owner whose
	// liveness lease was gone, rather than created on a free key.
	TookOver bool
}

// LivenessKey is the leases-bucket key of an owner's liveness lease: a
// short-lived lease every worker renews while it runs, to which its lane
// leases are bound. Owner ids are unique per process, so one key names one
// incarnation.
func LivenessKey(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return LivenessKeyPrefix + hex.EncodeToString(sum[:12])
}

// LivenessKeyPrefix starts every liveness key.
const LivenessKeyPrefix = "_live."

// leaseValue is what the lease key holds. A Create writes no epoch (its own
// revision is the epoch); a renewal writes the epoch it renews, so a later
// reader can tell a renewal of one lease from a new lease of the same owner.
type leaseValue struct {
	Owner string `json:"owner"`
	Epoch uint64 `json:"epoch,omitempty"`
	TTLMS int64  `json:"ttl_ms"`
	// Live is the epoch of the owner's liveness lease this lease is bound
	// to (0: unbound). A bound lease is void once that liveness lease is
	// gone: another owner may then take it over (see AcquireBound).
	Live uint64 `json:"live,omitempty"`
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
	return l.AcquireBound(ctx, lane, owner, 0)
}

// AcquireBound is Acquire for a lease bound to the owner's liveness lease
// of epoch live (see LivenessKey): the owner writes under it only while
// that liveness lease lives (or after rebinding it to a new one by a
// renewal). A key held under a bound lease whose owner has no liveness
// lease at all (it died) is taken over by a conditional write on the key's
// revision: the write's revision is the new epoch, higher than every
// earlier one, and the old owner's renewals fail on the revision check from
// then on.
//
// A key that was there when the create was refused but gone when its holder
// was read (released, or run out, in between: common in a rolling restart)
// is free: the create is tried again at once, up to maxLeaseConflicts
// times, rather than the caller told that the lane is held by nobody in
// particular (a HeldError naming no owner then means that the key kept
// coming and going).
func (l *Leases) AcquireBound(ctx context.Context, lane, owner string, live uint64) (*Lease, error) {
	for attempt := 1; ; attempt++ {
		lease, hrev, held, err := l.acquire(ctx, lane, owner, live)
		if err == nil || held == nil || attempt > maxLeaseConflicts {
			return lease, err
		}
		if held.Owner == "" {
			continue
		}
		if held.live == 0 {
			return nil, err
		}
		alive, aerr := l.alive(ctx, held.Owner)
		if aerr != nil || alive {
			return nil, err
		}
		lease, err = l.takeOver(ctx, lane, owner, live, hrev)
		if err == nil || !isConflict(err) {
			return lease, err
		}
		// The key moved under us (renewed, released, taken): look again.
	}
}

// alive reports whether owner has a liveness lease, of any epoch: owner
// ids name one process, so the process is alive. An owner that lost its
// liveness lease (a stall) and took a new one rebinds its lane leases to the
// new epoch itself; only an owner with none at all is taken over.
//
// The answer decides a takeover that no conditional write checks (the
// takeover's CAS is on the lane's key, not on the liveness key), so it is
// read from the stream leader: a direct get may be answered by a replica
// that lags (one just back from a partition) and does not hold the owner's
// latest liveness lease yet, and the live owner, whose self-fence still
// lets it write, would share the lane with the taker.
func (l *Leases) alive(ctx context.Context, owner string) (bool, error) {
	var v leaseValue
	var err error
	if l.js != nil {
		rctx, cancel := context.WithTimeout(ctx, l.timeout)
		var data []byte
		_, data, err = leaderLast(rctx, l.js, l.bucket, LivenessKey(owner))
		cancel()
		if err == nil {
			if uerr := json.Unmarshal(data, &v); uerr != nil {
				return false, fmt.Errorf("liveness lease of %s: decode: %w", owner, uerr)
			}
		}
	} else {
		v, _, err = l.value(ctx, LivenessKey(owner))
	}
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return v.Owner == owner, nil
}

// OwnerAlive reports whether owner has a liveness lease.
func (l *Leases) OwnerAlive(ctx context.Context, owner string) (bool, error) {
	return l.alive(ctx, owner)
}

// takeOver writes a fresh lease for owner over the key's revision hrev.
func (l *Leases) takeOver(ctx context.Context, lane, owner string, live, hrev uint64) (*Lease, error) {
	data, _ := json.Marshal(leaseValue{Owner: owner, TTLMS: l.ttl.Milliseconds(), Live: live})
	msg := nats.NewMsg("$KV." + l.bucket + "." + lane)
	msg.Data = data
	wctx, cancel := l.writeCtx(ctx)
	defer cancel()
	start := time.Now()
	ack, err := l.js.PublishMsg(wctx, msg, jetstream.WithExpectLastSequencePerSubject(hrev), jetstream.WithMsgTTL(l.ttl))
	if err == nil {
		return &Lease{Lane: lane, Owner: owner, Epoch: ack.Sequence, Rev: ack.Sequence, Renewed: start, Live: live, TookOver: true}, nil
	}
	if isAmbiguous(err) {
		v, rev, herr := l.value(ctx, lane)
		if herr == nil && v.Owner == owner && v.Epoch == 0 && v.Live == live {
			return &Lease{Lane: lane, Owner: owner, Epoch: rev, Rev: rev, Renewed: start, Live: live, TookOver: true}, nil
		}
	}
	return nil, fmt.Errorf("take over lease %s: %w", lane, err)
}

// acquire is one attempt of AcquireBound without the takeover; a held key
// gives its revision and a *HeldError.
func (l *Leases) acquire(ctx context.Context, lane, owner string, live uint64) (*Lease, uint64, *HeldError, error) {
	lease, hrev, err := l.create(ctx, lane, owner, live)
	var held *HeldError
	if errors.As(err, &held) {
		return nil, hrev, held, err
	}
	return lease, 0, nil, err
}

func (l *Leases) create(ctx context.Context, lane, owner string, live uint64) (*Lease, uint64, error) {
	data, _ := json.Marshal(leaseValue{Owner: owner, TTLMS: l.ttl.Milliseconds(), Live: live})
	wctx, cancel := l.writeCtx(ctx)
	defer cancel()
	start := time.Now()
	rev, err := l.kv.Create(wctx, lane, data, jetstream.KeyTTL(l.ttl))
	if err == nil {
		return &Lease{Lane: lane, Owner: owner, Epoch: rev, Rev: rev, Renewed: start, Live: live}, 0, nil
	}
	if isConflict(err) {
		v, hrev, at, herr := l.valueAt(ctx, lane)
		if herr == nil {
			ttl := time.Duration(v.TTLMS) * time.Millisecond
			if ttl <= 0 {
				ttl = l.ttl
			}
			return nil, hrev, &HeldError{Lane: lane, Owner: v.Owner, Rev: hrev, Epoch: v.epochOf(hrev), Expires: at.Add(ttl), live: v.Live}
		}
		if errors.Is(herr, ErrNotFound) {
			// Released or expired between the two calls: AcquireBound
			// tries again.
			return nil, 0, &HeldError{Lane: lane}
		}
		return nil, 0, herr
	}
	if isAmbiguous(err) {
		v, hrev, herr := l.value(ctx, lane)
		if herr == nil && v.Owner == owner && v.Epoch == 0 {
			// Our create landed (a value without an epoch is a create, and
			// nobody else writes our owner id), unrenewed: its revision
			// is the epoch.
			return &Lease{Lane: lane, Owner: owner, Epoch: hrev, Rev: hrev, Renewed: start, Live: live}, 0, nil
		}
		return nil, 0, fmt.Errorf("acquire lease %s: %w", lane, err)
	}
	return nil, 0, fmt.Errorf("acquire lease %s: %w", lane, err)
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
	data, _ := json.Marshal(leaseValue{Owner: lease.Owner, Epoch: lease.Epoch, TTLMS: l.ttl.Milliseconds(), Live: lease.Live})
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

// Orphans returns the keys of the live bound leases whose owner has no
// liveness lease: leases of dead owners, which AcquireBound takes over. With
// liveKey set, only the leases of the owner of that liveness key are
// looked at (the owner whose liveness lease just expired). Keys starting
// with '_' (the watcher's, liveness keys) are skipped. One watch of the
// bucket's last values, plus one read per distinct owner.
func (l *Leases) Orphans(ctx context.Context, liveKey string) ([]string, error) {
	watch, err := l.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	defer stopWatch(watch)
	lanes := map[string][]string{} // owner -> lanes
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-watch.Updates():
			if !ok {
				return nil, errors.New("list leases: watch closed before the initial values were read")
			}
			if e == nil {
				done = true
				break
			}
			if strings.HasPrefix(e.Key(), "_") {
				continue
			}
			var v leaseValue
			if json.Unmarshal(e.Value(), &v) != nil || v.Live == 0 {
				continue
			}
			if liveKey != "" && LivenessKey(v.Owner) != liveKey {
				continue
			}
			lanes[v.Owner] = append(lanes[v.Owner], e.Key())
		}
	}
	var out []string
	for owner, keys := range lanes {
		alive, err := l.alive(ctx, owner)
		if err != nil {
			return out, err
		}
		if !alive {
			out = append(out, keys...)
		}
	}
	return out, nil
}
