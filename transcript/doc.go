// Package transcript is the transcript log of agentfleet sessions: the stream
// FLEET_TX, one subject <prefix>.tx.<session_id> per session, one message per
// entry (JSON body; headers Fleet-Entry-Id, Fleet-Session-Id and, when set,
// Fleet-Turn-Id and Fleet-Inbox-Seq).
//
// # Fencing
//
// Every append names the subject's last sequence it expects
// (Nats-Expected-Last-Subject-Sequence), so a lane's transcript has exactly
// one writer at a time: a new owner appends a KindFence entry right after
// taking the lease, and any append a former owner prepared before the fence
// fails with a *ConflictError (errors.Is(err, ErrConflict)) that carries the
// actual tail. A lane's appends are sequential: each names the sequence the
// previous one returned.
//
// Append runs on its own timeout, not the caller's cancellation, and resolves
// ambiguous outcomes itself (a lost ack, a timeout, a 10164 on a replicated
// stream) by reading the subject's last entry and comparing its entry id; a
// resend carries Nats-Msg-Id = the entry id. It never turns an unknown
// outcome into a conflict: if the server stays unreachable it returns
// ErrOutcomeUnknown, and calling Append again with the same entry resolves it.
//
//	log, err := transcript.New(js, broker.MustNames("fleet"), nil)
//	...
//	entries, last, err := log.Load(ctx, sessionID)
//	// right after taking the lease:
//	last, err = log.Append(ctx, sessionID, last, &transcript.Entry{Kind: transcript.KindFence, Epoch: epoch, Owner: me})
//	var ce *transcript.ConflictError
//	if errors.As(err, &ce) {
//		// someone wrote meanwhile: reload and fence again
//	}
//	// during a turn:
//	last, err = log.Append(ctx, sessionID, last, &transcript.Entry{Kind: transcript.KindMessage, Role: transcript.RoleAssistant, Content: reply})
//
// # Rewrites
//
// Nothing is ever rewritten in place. /undo and /retry append a KindRewind
// entry built by RewindUserTurns; Load marks the entries it covers Deleted,
// and Effective returns the conversation the agent sees. TurnEnded and
// FenceEpoch read the other control entries.
//
// # Reads
//
// LastSeq, Get and the start of Load ask the stream leader (STREAM.MSG.GET)
// rather than any replica (DIRECT.GET), so they reflect every acknowledged
// append on replicated streams too. Load then streams the subject through an
// ephemeral ordered consumer up to the tail it read, and deletes the consumer.
package transcript
