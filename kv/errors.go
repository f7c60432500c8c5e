package kv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var (
	// ErrNotFound means the key has no live value.
	ErrNotFound = errors.New("not found")
	// ErrExists means a create found a live value.
	ErrExists = errors.New("already exists")
	// ErrRevisionMismatch means a CAS lost to another write.
	ErrRevisionMismatch = errors.New("revision mismatch")
	// ErrLeaseLost means the caller no longer owns the lane: its lease expired
	// or the entry names another owner or epoch. Nothing was written.
	ErrLeaseLost = errors.New("lease lost")
	// ErrNoChange is returned by a mutate function to skip the write.
	ErrNoChange = errors.New("no change")
)

// HeldError says a lease is held by another owner (or by the caller's
// own owner id: a lease of its own it did not release).
type HeldError struct {
	Lane string
	// Owner is the holder's owner id; empty when the key was gone by the
	// time it was read, at every attempt AcquireBound made.
	Owner string
	// Rev is the key's revision, Epoch that of the create that took the
	// lease the key holds (see Lease).
	Rev   uint64
	Epoch uint64
	// Expires is when the lease runs out unless renewed: its last write's
	// server time plus its TTL (zero when unknown). Read against the local
	// clock it is an estimate, good for scheduling a retry, never for
	// deciding who owns the lane.
	Expires time.Time
	// live is the liveness epoch the held lease is bound to (0: unbound).
	live uint64
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("lease %s is held by %s", e.Lane, e.Owner)
}

// Is makes errors.Is(err, ErrExists) true for a held lease.
func (e *HeldError) Is(target error) bool { return target == ErrExists }

// isConflict reports a CAS conflict (10071, or 10164 on R3 under contention).
// nats.go maps both codes for KV Update and Create, but not for Delete with
// LastRevision nor for the second write of a Create over a delete marker,
// nor for raw publishes: those carry the bare API error.
func isConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) || isWrongLastSeq(err)
}

// isWrongLastSeq reports a "wrong last sequence" API error: 10071, or 10164
// which an R3 stream returns while another conditional write of the same
// subject is in flight, even when the expected sequence was right.
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

// isAmbiguous reports an outcome that may or may not have been applied.
func isAmbiguous(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrConnectionReconnecting)
}
