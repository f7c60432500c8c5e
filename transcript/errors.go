package transcript

import (
	"errors"
	"fmt"
)

var (
	// ErrConflict means the session's transcript subject has moved past the
	// lastSeq an Append expected: another writer (a new owner's fence, most
	// likely) appended first, and this entry was not stored. The error is a
	// *ConflictError that carries the actual tail.
	ErrConflict = errors.New("transcript conflict")

	// ErrNotFound means the entry asked for does not exist.
	ErrNotFound = errors.New("transcript entry not found")

	// ErrOutcomeUnknown means Append could not learn, within its write
	// timeout, whether the entry was stored (the server or the connection
	// stayed unreachable). It is not a conflict and says nothing about the
	// lease: call Append again with the same entry (same ID) and the same
	// lastSeq, and it resolves to the stored sequence or to a conflict.
	ErrOutcomeUnknown = errors.New("transcript append outcome unknown")

	// ErrInvalidEntry means Append refused an entry before sending it.
	ErrInvalidEntry = errors.New("invalid transcript entry")

	// ErrInvalidSessionID means a session id is not a single subject token.
	ErrInvalidSessionID = errors.New("invalid session id")
)

// ConflictError is the error of an Append whose lastSeq was stale. It wraps
// ErrConflict:
//
//	var ce *transcript.ConflictError
//	if errors.As(err, &ce) { reload, or stop: ce.Actual is the subject's tail }
type ConflictError struct {
	// SessionID is the transcript that moved.
	SessionID string
	// Expected is the lastSeq the caller passed.
	Expected uint64
	// Actual is the subject's last sequence as the server reported it (or
	// as read right after the rejection); 0 means the subject is empty.
	Actual uint64
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("transcript %s: expected last seq %d, actual %d: %v", e.SessionID, e.Expected, e.Actual, ErrConflict)
}

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Unwrap() error { return ErrConflict }
