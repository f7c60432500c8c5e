// Package worker runs agentfleet's lanes: it takes deliveries from the
// shared workers consumer, owns a lane under a lease, runs its turns and
// commands in inbox order, and recovers what a dead owner left in flight.
//
// The package is layered along the ownership seam.
//
// The owner layer (owner.go and owner_inbox.go, type owner) is everything that makes one lane
// ours and every durable write of it safe: the lease and its renew loop,
// the self-fence (no write once the lease could have expired), the fence
// entries on the lane's transcripts, the deliveries held for the lane, the
// hints that announce its inbox messages, and the entry with the revision of
// our own last write. Its API is small: mutate (the entry, by CAS fenced by
// owner and epoch), append (to a transcript, fenced on its tail), publish
// (a reply or notice, under the lease), peek (the inbox), commit
// (committed_seq past a seq, acking what it covers), with begin, release and
// giveUp to start and end an ownership.
//
// The runner (runner.go, type lane, which embeds *owner) is the lane's
// goroutine: run takes the lease, own drives the ownership, settle
// (settle.go) decides after every step whether to keep the lane, give it up
// or release it, from the error the step returned.
//
// The step units sit on top of the owner:
//
//	step.go      the next step read from the inbox, and runStep, which hands it to its unit
//	turn.go      a turn: record its intent, run the agent, finish and commit it
//	busy.go      input that arrives while a turn runs (interrupt, queue, steer, /status)
//	emitter.go   the agent's output as transcript entries and replies
//	msgids.go    platform message ids (a platform's retry is answered once)
//	commands.go  the fleet's commands (/new, /reset, /resume, /undo, /title, admin ones)
//	internal.go  the internal commands (wake, expire, automatic resume)
//	recover.go   a turn left in flight: resume, park, or dead-letter it
//
// Maintenance runs beside the lanes, on the worker: watcher.go (the
// watcher lease and its loop), expiry.go (lease expiries wake stranded
// lanes), sweep.go (expired sessions and stranded lanes), prune.go (old
// entries). worker.go is the Worker itself (dispatch of deliveries to
// lanes, drain, stop); config.go its Config (knobs the configuration file
// has default to config.Default); errors.go holds the sentinels, faults.go
// the crash and pause points the fault tests use; tracing.go continues the
// ingress's trace through a lane's deliveries and turns (spans, the turn's
// log attributes, the reply latency).
package worker
