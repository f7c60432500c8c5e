// Package kv holds agentfleet's durable per-lane state on JetStream
// key-value buckets.
//
//   - Store (store.go) is the sessions bucket: one SessionEntry per lane,
//     written only by compare-and-set (Mutate), optionally fenced by the
//     lane's owner and lease epoch (Fence), plus the session-id index and
//     the whole-bucket operator operations (admin.go).
//   - Leases (leases.go) are the per-lane exclusive leases: a key created
//     with a server-side TTL and renewed by a conditional write. The server
//     judges expiry; the revision of the create is the lease epoch.
//   - MsgIDs (msgids.go) remembers platform message ids for a while, so a
//     platform's redelivery of a message is answered once.
//
// Errors are sentinels in errors.go (ErrLeaseLost, ErrNoChange,
// ErrNotFound, ...), matched with errors.Is.
package kv
