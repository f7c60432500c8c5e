package worker

import "errors"

// The worker's own sentinels. Errors of the stores keep their packages'
// names (kv.ErrLeaseLost, kv.ErrNoChange, transcript.ErrConflict, ...):
// the worker matches them with errors.Is and never re-exports them.
var (
	// errDrain is the cause of a running turn's cancellation when a
	// graceful stop ran out of its drain timeout.
	errDrain = errors.New("drain timeout")
	// errStopped is the cause of a running turn's cancellation by /stop.
	errStopped = errors.New("turn stopped by /stop")
	// errHardStop is the cause that ends an ownership on purpose: a
	// release, a give-up or the worker's hard stop.
	errHardStop = errors.New("worker stopping")
	// errInboxGone: the ownership's inbox stream was deleted (and maybe
	// made again); see owner.peek.
	errInboxGone = errors.New("inbox stream recreated")
	// errNothingSteered marks a steer that failed before it recorded
	// anything.
	errNothingSteered = errors.New("no input steered")
	// errStepFailed wraps the cause of a lane step (or a recovery) that
	// did not complete while the lane was still owned: a failed durable
	// write, a read that failed, a drain that cut it. settle decides what
	// the owner does about it.
	errStepFailed = errors.New("lane step failed")
)
