package broker

import (
	"fmt"
	"strings"
)

// DefaultPrefix is the subject, stream and bucket prefix used when none is
// configured. Several fleets can share one NATS account by choosing
// different prefixes.
const DefaultPrefix = "fleet"

// Header names carried on fleet messages. They are case-sensitive in NATS.
const (
	// HdrMsgID is JetStream's de-duplication header.
	HdrMsgID = "Nats-Msg-Id"
	// HdrSessionKey carries the session key (not the lane token) of a message.
	HdrSessionKey = "Fleet-Session-Key"
	// HdrKind says what an inbox message is: KindMessage, KindQueue, KindCommand
	// or KindInternal. Workers read it before parsing the body.
	HdrKind = "Fleet-Kind"
	// HdrPlatformMsgID is the platform's own message id (platform+chat+message).
	HdrPlatformMsgID = "Fleet-Platform-Msg-Id"
	// HdrEntryID is the unique id of a transcript entry; an ambiguous append is
	// resolved by comparing it with the subject's last entry.
	HdrEntryID = "Fleet-Entry-Id"
	// HdrTurnID, HdrSessionID, HdrTxSeq and HdrInboxSeq annotate replies and
	// transcript entries.
	HdrTurnID    = "Fleet-Turn-Id"
	HdrSessionID = "Fleet-Session-Id"
	HdrTxSeq     = "Fleet-Tx-Seq"
	HdrInboxSeq  = "Fleet-Inbox-Seq"
	// HdrOutboxSeq, on a mailbox message, is the outbox stream seq of the
	// reply it delivers: a lane's mailbox holds its replies in outbox order,
	// so its last message says which replies are already there.
	HdrOutboxSeq = "Fleet-Outbox-Seq"
	// HdrReason explains a dead letter or a failed delivery.
	HdrReason = "Fleet-Reason"
	// HdrTraceParent is the W3C trace context header, kept lower case.
	HdrTraceParent = "traceparent"
)

// Values of HdrKind.
const (
	KindMessage  = "message"
	KindQueue    = "queue"
	KindCommand  = "command"
	KindInternal = "internal"
	// KindSkip marks a mailbox message that stands for an outbox message
	// with nothing to show (it could not be read): readers pass over it.
	KindSkip = "skip"
)

// Partitions is the fixed number of inbox partitions. It never changes: the
// partition of a lane is part of its inbox subject.
const Partitions = 64

// Names derives every subject, stream, bucket and consumer name of a fleet
// from its prefix. It is the one place those names are spelled.
type Names struct {
	prefix string
	upper  string
}

// NewNames returns the names for prefix (DefaultPrefix when empty). The
// prefix must be a single subject token of [A-Za-z0-9_-].
func NewNames(prefix string) (Names, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	// Lower case only: stream names are the upper-cased prefix, so "fleet"
	// and "Fleet" (or "a-b" and "a_b", were '-' allowed) would share the
	// same streams.
	for _, r := range prefix {
		ok := r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9')
		if !ok {
			return Names{}, fmt.Errorf("prefix %q: only lower-case letters, digits and '_' are allowed", prefix)
		}
	}
	return Names{prefix: prefix, upper: strings.ToUpper(prefix)}, nil
}

// MustNames is NewNames for prefixes known to be valid.
func MustNames(prefix string) Names {
	n, err := NewNames(prefix)
	if err != nil {
		panic(err)
	}
	return n
}

// Prefix returns the configured prefix.
func (n Names) Prefix() string { return n.prefix }

// Streams.

// InboxStream holds every inbound message and command: subjects <prefix>.in.>.
func (n Names) InboxStream() string { return n.upper + "_IN" }

// TranscriptStream holds transcripts, one subject per session id.
func (n Names) TranscriptStream() string { return n.upper + "_TX" }

// OutboxStream holds replies and notices to deliver to platforms.
func (n Names) OutboxStream() string { return n.upper + "_OUT" }

// ProbeStream holds one message, rewritten by readiness checks to learn
// whether the store still takes writes.
func (n Names) ProbeStream() string { return n.upper + "_PROBE" }

// ProbeSubject is the subject of ProbeStream.
func (n Names) ProbeSubject() string { return n.prefix + ".probe" }

// EventStream holds lifecycle events and dead letters.
func (n Names) EventStream() string { return n.upper + "_EV" }

// Subjects.

// InboxSubject is the subject of a lane's inbox in partition p.
func (n Names) InboxSubject(p int, lane string) string {
	return fmt.Sprintf("%s.in.%d.%s", n.prefix, p, lane)
}

// InboxLaneFilter matches a lane's inbox whatever its partition.
func (n Names) InboxLaneFilter(lane string) string { return n.prefix + ".in.*." + lane }

// InboxWildcard matches every inbox subject.
func (n Names) InboxWildcard() string { return n.prefix + ".in.>" }

// HintSubject carries a copy of each inbox message, republished by the
// server after the message is stored, with its stream seq and the subject's
// previous seq (Nats-Sequence, Nats-Last-Sequence): a lane's owner subscribes
// to it and takes new messages from it without reading the stream.
func (n Names) HintSubject(p int, lane string) string {
	return fmt.Sprintf("%s.hint.%d.%s", n.prefix, p, lane)
}

// HintWildcard matches every hint subject.
func (n Names) HintWildcard() string { return n.prefix + ".hint.>" }

// InboxPartitionBase is the string whose FNV-1a hash gives a lane's partition.
func (n Names) InboxPartitionBase(lane string) string { return n.prefix + ".in." + lane }

// TranscriptSubject is the transcript of one session id.
func (n Names) TranscriptSubject(sessionID string) string { return n.prefix + ".tx." + sessionID }

// TranscriptWildcard matches every transcript subject.
func (n Names) TranscriptWildcard() string { return n.prefix + ".tx.>" }

// OutboxSubject carries replies for lane on platform.
func (n Names) OutboxSubject(platform, lane string) string {
	return n.prefix + ".out." + platform + "." + lane
}

// OutboxPlatformFilter matches every reply for platform.
func (n Names) OutboxPlatformFilter(platform string) string {
	return n.prefix + ".out." + platform + ".>"
}

// OutboxLaneFilter matches the replies of one lane on any platform.
func (n Names) OutboxLaneFilter(lane string) string { return n.prefix + ".out.*." + lane }

// BoxSubject is a lane's mailbox on platform: the replies a delivery consumer
// accepted, de-duplicated and in order. The HTTP adapter serves it.
func (n Names) BoxSubject(platform, lane string) string {
	return n.prefix + ".box." + platform + "." + lane
}

// BoxWildcard matches every mailbox subject.
func (n Names) BoxWildcard() string { return n.prefix + ".box.>" }

// BoxHintSubject carries the headers of each message stored in a lane's
// mailbox (its stream seq in Nats-Sequence), republished by the server once
// stored: reply readers wait on it instead of holding a consumer each.
func (n Names) BoxHintSubject(platform, lane string) string {
	return n.prefix + ".boxhint." + platform + "." + lane
}

// BoxHintPlatformFilter matches the mailbox hints of every lane of platform.
func (n Names) BoxHintPlatformFilter(platform string) string {
	return n.prefix + ".boxhint." + platform + ".>"
}

// BoxHintWildcard matches every mailbox hint.
func (n Names) BoxHintWildcard() string { return n.prefix + ".boxhint.>" }

// OutboxWildcard matches every reply subject.
func (n Names) OutboxWildcard() string { return n.prefix + ".out.>" }

// EventSubject carries a lifecycle event of kind for lane.
func (n Names) EventSubject(kind, lane string) string { return n.prefix + ".ev." + kind + "." + lane }

// EventWildcard matches every event subject.
func (n Names) EventWildcard() string { return n.prefix + ".ev.>" }

// DeadLetterSubject holds the inbox messages a lane dead-lettered.
func (n Names) DeadLetterSubject(lane string) string { return n.prefix + ".dlq." + lane }

// DeadLetterWildcard matches every dead-letter subject.
func (n Names) DeadLetterWildcard() string { return n.prefix + ".dlq.>" }

// DeltaSubject is the core subject (no stream captures it) on which the
// owner of lane streams the text deltas of a running turn.
func (n Names) DeltaSubject(lane string) string { return n.prefix + ".delta." + lane }

// DeltaWildcard matches every delta subject.
func (n Names) DeltaWildcard() string { return n.prefix + ".delta.>" }

// EvictSubject is the core subject on which workers broadcast agent-cache evictions.
func (n Names) EvictSubject() string { return n.prefix + ".ctl.evict" }

// ForwardSubject is the core subject on which the worker whose owner id
// hashes to token receives the deliveries other workers forward to it.
func (n Names) ForwardSubject(token string) string { return n.prefix + ".ctl.fwd." + token }

// ForwardWildcard matches every worker's forward subject.
func (n Names) ForwardWildcard() string { return n.prefix + ".ctl.fwd.>" }

// APISubject is the subject of a fleet.api endpoint.
func (n Names) APISubject(endpoint string) string { return n.prefix + ".api." + endpoint }

// APIPrefix is the group of the state-database micro service.
func (n Names) APIPrefix() string { return n.prefix + ".api" }

// ServiceName is the NATS micro service name a fleet process of role
// (worker, ingress) registers, listed by `nats micro ls`.
func (n Names) ServiceName(role string) string { return "agentfleet-" + role }

// ServiceStatusSubject is the subject of the status endpoint of one
// process's micro service: <prefix>.svc.<role>.<instance>.status.
func (n Names) ServiceStatusSubject(role, instance string) string {
	return n.prefix + ".svc." + role + "." + instance + ".status"
}

// Buckets.

// SessionsBucket maps lane tokens to SessionEntry records.
func (n Names) SessionsBucket() string { return n.prefix + "_sessions" }

// SessionIDsBucket maps session ids to the lane token that owns them.
func (n Names) SessionIDsBucket() string { return n.prefix + "_sessionids" }

// LeasesBucket holds lane leases, the expiry-watcher lease and the
// workers' liveness leases (keys _live.*), with per-key TTLs.
func (n Names) LeasesBucket() string { return n.prefix + "_leases" }

// MsgIDsBucket keeps platform message ids for their retry horizon.
func (n Names) MsgIDsBucket() string { return n.prefix + "_msgids" }

// DeliveredBucket records delivered reply ids for their retry horizon.
func (n Names) DeliveredBucket() string { return n.prefix + "_delivered" }

// WorkersBucket is the worker registry, with heartbeats.
func (n Names) WorkersBucket() string { return n.prefix + "_workers" }

// Consumers.

// WorkersConsumer is the durable pull consumer shared by every worker.
func (n Names) WorkersConsumer() string { return "workers" }

// DeliveryConsumer is the durable consumer that delivers replies for platform.
func (n Names) DeliveryConsumer(platform string) string { return "deliver_" + platform }

// IndexerConsumer feeds the state database.
func (n Names) IndexerConsumer(stream string) string { return "indexer_" + strings.ToLower(stream) }

// IndexerConsumerNamed is the durable consumer of one of several indexers
// (each writes its own database file) on stream.
func (n Names) IndexerConsumerNamed(stream, name string) string {
	if name == "" {
		return n.IndexerConsumer(stream)
	}
	return n.IndexerConsumer(stream) + "_" + name
}

// APIService is the name of the state database's micro service.
func (n Names) APIService() string { return n.prefix + "_api" }

// KV keys that are not lanes.

// WatcherLeaseKey is the leases-bucket key of the expiry watcher's leader.
func (n Names) WatcherLeaseKey() string { return "_watcher" }

// SingletonLeaseKey is the leases-bucket key of a fleet-wide singleton: the
// one long-lived platform connection or poll loop of kind (e.g.
// "telegram_poll") for the bot or app identified by id (a hash of its token,
// never the token).
func (n Names) SingletonLeaseKey(kind, id string) string { return "_singleton." + kind + "." + id }

// DeliveryFailedKind is the event kind of a reply a platform delivery gave up
// on after its retry budget: <prefix>.ev.delivery_failed.<lane>.
const DeliveryFailedKind = "delivery_failed"

// DeliveryFailedWildcard matches every delivery-failure event.
func (n Names) DeliveryFailedWildcard() string { return n.prefix + ".ev." + DeliveryFailedKind + ".>" }

// PlatformDeliveredKey is the delivered-bucket key of the delivery state of
// a reply on a chat platform (its reply id written as a lane token).
func (n Names) PlatformDeliveredKey(platform, replyToken string) string {
	return platform + "." + replyToken
}
