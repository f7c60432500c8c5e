package broker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// InboxIDMetadata is the inbox stream metadata key holding its identity. A
// SessionEntry's committed_seq is only meaningful for the inbox id stored
// beside it.
const InboxIDMetadata = "fleet_inbox_id"

// ProvisionConfig sizes the streams, buckets and consumers of a fleet.
type ProvisionConfig struct {
	Names Names
	// Replicas for every stream and bucket: 1, 3 or 5. Defaults to 1.
	Replicas int
	// LeaseTTL is the lane lease TTL; the workers consumer's AckWait is at
	// least this. Defaults to DefaultLeaseTTL.
	LeaseTTL time.Duration
	// MaxAckPending of the workers consumer. Defaults to 10000.
	MaxAckPending int
	// MsgIDTTL is how long platform message ids are remembered. Defaults to 7 days.
	MsgIDTTL time.Duration
	// Duplicates is the inbox stream's Msg-Id window. Defaults to 10m.
	Duplicates time.Duration
	// EventMaxAge bounds lifecycle events. Defaults to 30 days.
	EventMaxAge time.Duration
	// InboxStreams is the number of inbox streams the partitions are spread
	// over. A new fleet gets this many (1 when 0); an existing fleet keeps
	// its count, and a non-zero value that differs is refused
	// (ErrInboxStreams): the count changes only by migration.
	InboxStreams int
	// BindOnly opens the existing streams, buckets and workers consumer
	// without creating or updating any: for a process whose NATS user may
	// not (a least-privilege role; see Permissions). A missing one is an
	// error matching ErrNotProvisioned that names it. The sizes above are
	// then not used.
	BindOnly bool
}

// ErrNotProvisioned is matched (errors.Is) by a BindOnly provisioning that
// found a stream, bucket or consumer missing: the fleet must be provisioned
// first by a user allowed to create them (`agentfleet provision`).
var ErrNotProvisioned = errors.New("the fleet is not provisioned: run `agentfleet provision` with a NATS user of role admin")

func (c *ProvisionConfig) withDefaults() ProvisionConfig {
	out := *c
	if out.Names.prefix == "" {
		out.Names = MustNames(DefaultPrefix)
	}
	if out.Replicas == 0 {
		out.Replicas = 1
	}
	if out.LeaseTTL == 0 {
		out.LeaseTTL = DefaultLeaseTTL
	}
	if out.MaxAckPending == 0 {
		out.MaxAckPending = 10000
	}
	if out.MsgIDTTL == 0 {
		out.MsgIDTTL = 7 * 24 * time.Hour
	}
	if out.Duplicates == 0 {
		out.Duplicates = 10 * time.Minute
	}
	if out.EventMaxAge == 0 {
		out.EventMaxAge = 30 * 24 * time.Hour
	}
	return out
}

// WorkersAckWait is the AckWait of the workers consumer for a lease TTL: a
// held delivery is redelivered a little after its owner's lease would expire.
// An owner sends InProgress for its held deliveries right after each lease
// renewal, so a delivery of a dead owner comes back AckWait after the last
// renewal: half a second after the lease ran out, which bounds the
// take-over of a crashed worker's lanes by TTL + 0.5 s.
func WorkersAckWait(leaseTTL time.Duration) time.Duration { return leaseTTL + 500*time.Millisecond }

// Resources are the provisioned handles.
type Resources struct {
	// JS is the JetStream context the resources were opened with.
	JS jetstream.JetStream
	// Inbox, InboxID and Consumer are inbox stream 0 (the only one of a
	// fleet with one inbox stream). Code that reads a lane's inbox asks
	// Inboxes for the lane's stream instead.
	Inbox       jetstream.Stream
	Transcripts jetstream.Stream
	Outbox      jetstream.Stream
	Events      jetstream.Stream
	// Probe is the one-message stream readiness checks write to.
	Probe      jetstream.Stream
	InboxID    string
	Sessions   jetstream.KeyValue
	SessionIDs jetstream.KeyValue
	Leases     jetstream.KeyValue
	MsgIDs     jetstream.KeyValue
	Delivered  jetstream.KeyValue
	Workers    jetstream.KeyValue
	Consumer   jetstream.Consumer
	// InboxMap is the bucket of the inbox map; Inboxes is the view of it
	// (call Inboxes.Watch to follow a migration).
	InboxMap jetstream.KeyValue
	Inboxes  *InboxSet
	// Warnings are settings provisioning kept from the existing assets
	// rather than the ones asked for (see Provision); callers log them.
	Warnings []string
}

// Provision creates or updates every stream, bucket and the workers consumer
// of a fleet. It is idempotent and safe to run from every process at start.
// Retryable tells whether an error it returns may go away when tried again
// (JetStream not ready yet) or needs a change of configuration (replicas
// above 1 on a server that is not clustered: ErrReplicasNeedCluster).
func Provision(ctx context.Context, js jetstream.JetStream, pc ProvisionConfig) (*Resources, error) {
	r, err := provision(ctx, js, pc)
	if err != nil {
		return nil, explainProvision(err)
	}
	return r, nil
}

func provision(ctx context.Context, js jetstream.JetStream, pc ProvisionConfig) (*Resources, error) {
	c := pc.withDefaults()
	if c.BindOnly {
		return bind(ctx, js, c)
	}
	n := c.Names
	if c.Replicas != 1 && c.Replicas != 3 && c.Replicas != 5 {
		return nil, permanent(fmt.Errorf("provision: replicas %d: want 1, 3 or 5", c.Replicas))
	}
	r := &Resources{JS: js}
	var err error
	// Every process provisions at start with its own configuration. One
	// started with a smaller replica count must not quietly turn a
	// replicated fleet into single copies: existing assets keep the larger
	// count (scaling down is an operator's deliberate act, with the nats
	// CLI).
	replicas := func(stream string) int {
		have := existingReplicas(ctx, js, stream)
		if have > c.Replicas {
			r.Warnings = append(r.Warnings, fmt.Sprintf("%s has %d replicas and the configuration asks for %d: kept %d (scale down with the nats CLI if that is meant)", stream, have, c.Replicas, have))
			return have
		}
		return c.Replicas
	}

	if err := CheckInboxStreams(c.InboxStreams); err != nil {
		return nil, permanent(fmt.Errorf("provision: %w", err))
	}
	if r.InboxMap, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: n.InboxMapBucket(), Description: "which inbox stream holds each partition", History: 1,
		Storage: jetstream.FileStorage, Replicas: replicas("KV_" + n.InboxMapBucket()),
	}); err != nil {
		return nil, fmt.Errorf("provision bucket %s: %w", n.InboxMapBucket(), err)
	}
	imap, err := ensureInboxMap(ctx, js, n, r.InboxMap, c.InboxStreams)
	if err != nil {
		return nil, err
	}
	inboxes := make([]jetstream.Stream, imap.Streams)
	for i := range inboxes {
		var id string
		if inboxes[i], id, err = ensureInbox(ctx, js, InboxStreamConfig(n, imap, i, replicas(n.InboxStreamAt(i)), c.Duplicates)); err != nil {
			return nil, err
		}
		if i == 0 {
			r.Inbox, r.InboxID = inboxes[0], id
		}
	}
	if r.Transcripts, err = ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        n.TranscriptStream(),
		Description: "agentfleet transcripts: one subject per session id",
		Subjects:    []string{n.TranscriptWildcard()},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas(n.TranscriptStream()),
		Duplicates:  2 * time.Minute,
		AllowDirect: true,
	}); err != nil {
		return nil, err
	}
	if r.Outbox, err = ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        n.OutboxStream(),
		Description: "agentfleet replies to deliver, and per-lane mailboxes of delivered replies",
		Subjects:    []string{n.OutboxWildcard(), n.BoxWildcard()},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas(n.OutboxStream()),
		Duplicates:  c.Duplicates,
		AllowDirect: true,
		// Hints for reply readers, sent once a mailbox message is stored:
		// headers only (the stream seq), readers fetch it by direct get.
		RePublish: &jetstream.RePublish{Source: n.BoxWildcard(), Destination: n.BoxHintWildcard(), HeadersOnly: true},
	}); err != nil {
		return nil, err
	}
	if r.Events, err = ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        n.EventStream(),
		Description: "agentfleet lifecycle events and dead letters",
		Subjects:    []string{n.EventWildcard(), n.DeadLetterWildcard()},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas(n.EventStream()),
		MaxAge:      c.EventMaxAge,
		Duplicates:  2 * time.Minute,
		AllowDirect: true,
	}); err != nil {
		return nil, err
	}

	if r.Probe, err = ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        n.ProbeStream(),
		Description: "agentfleet readiness probe: one message, rewritten to learn whether the store takes writes",
		Subjects:    []string{n.ProbeSubject()},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas(n.ProbeStream()),
		MaxMsgs:     1,
		Discard:     jetstream.DiscardOld,
	}); err != nil {
		return nil, err
	}

	kvs := []struct {
		dst *jetstream.KeyValue
		cfg jetstream.KeyValueConfig
	}{
		{&r.Sessions, jetstream.KeyValueConfig{Bucket: n.SessionsBucket(), Description: "lane -> SessionEntry", History: 1}},
		{&r.SessionIDs, jetstream.KeyValueConfig{Bucket: n.SessionIDsBucket(), Description: "session id -> lane", History: 1}},
		{&r.Leases, jetstream.KeyValueConfig{Bucket: n.LeasesBucket(), Description: "lane leases (per-key TTL)", History: 1, LimitMarkerTTL: time.Second}},
		{&r.MsgIDs, jetstream.KeyValueConfig{Bucket: n.MsgIDsBucket(), Description: "platform message id -> inbox seq", History: 1, TTL: c.MsgIDTTL}},
		{&r.Delivered, jetstream.KeyValueConfig{Bucket: n.DeliveredBucket(), Description: "delivered reply ids", History: 1, TTL: c.MsgIDTTL}},
		{&r.Workers, jetstream.KeyValueConfig{Bucket: n.WorkersBucket(), Description: "worker registry (per-key TTL heartbeats)", History: 1, LimitMarkerTTL: time.Second}},
	}
	for _, k := range kvs {
		k.cfg.Storage = jetstream.FileStorage
		k.cfg.Replicas = replicas("KV_" + k.cfg.Bucket)
		kv, err := js.CreateOrUpdateKeyValue(ctx, k.cfg)
		if err != nil {
			return nil, fmt.Errorf("provision bucket %s: %w", k.cfg.Bucket, err)
		}
		*k.dst = kv
	}

	for i, st := range inboxes {
		cons, err := ensureWorkersConsumer(ctx, st, c, r)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			r.Consumer = cons
		}
	}
	if r.Inboxes, err = OpenInboxes(ctx, js, n, true); err != nil {
		return nil, err
	}
	return r, nil
}

// InboxStreamConfig is the configuration of inbox stream i under map m.
// Its subjects are m's for a new stream; ensureInbox keeps the subjects of
// an existing one (only the migration changes them).
func InboxStreamConfig(n Names, m InboxMap, i, replicas int, duplicates time.Duration) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        n.InboxStreamAt(i),
		Description: fmt.Sprintf("agentfleet inbox %d: accepted messages and commands of its partitions, by lane", i),
		Subjects:    m.Subjects(n, i),
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		Duplicates:  duplicates,
		AllowDirect: true,
		// Hints for lane owners, sent only once a message is stored (a core
		// subscription on the inbox subject itself can fire before that).
		// They carry the message: with the Nats-Last-Sequence the server
		// adds (the subject's previous seq), an owner reads its lane's new
		// messages from the hints, without a direct get. Nats-Stream says
		// which inbox stream the seqs belong to.
		RePublish: &jetstream.RePublish{Source: n.InboxWildcard(), Destination: n.HintWildcard()},
	}
}

// ensureInboxMap reads the inbox map, creating it with want streams (1 when
// 0) for a new fleet, and refuses a non-zero want that differs from the
// fleet's count.
func ensureInboxMap(ctx context.Context, js jetstream.JetStream, n Names, bucket jetstream.KeyValue, want int) (InboxMap, error) {
	for attempt := 0; attempt < 5; attempt++ {
		m, _, err := ReadInboxMap(ctx, bucket)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			count := max(want, 1)
			if _, err := js.Stream(ctx, n.InboxStream()); err == nil {
				// A fleet provisioned before the count was configurable:
				// its one stream holds every partition, whatever this
				// process asks for (the count changes by migration).
				count = 1
			}
			m = DefaultInboxMap(count)
			if _, err := bucket.Create(ctx, InboxMapKey, m.Encode()); errors.Is(err, jetstream.ErrKeyExists) {
				continue
			} else if err != nil {
				return InboxMap{}, fmt.Errorf("provision inbox map: %w", err)
			}
			continue // read it back, and check the count against it
		}
		if err != nil {
			return InboxMap{}, fmt.Errorf("provision inbox map: %w", err)
		}
		if want != 0 && want != m.Count() {
			return InboxMap{}, permanent(fmt.Errorf("%w: the fleet has %d inbox streams and this process is configured for %d (nats.inbox_streams); change the count on the running fleet with `fleetctl inbox streams %d`, or set nats.inbox_streams to %d or 0",
				ErrInboxStreams, m.Count(), want, want, m.Count()))
		}
		return m, nil
	}
	return InboxMap{}, errors.New("provision inbox map: could not settle it")
}

// ensureWorkersConsumer creates or updates the workers consumer of an inbox
// stream, never lowering what running workers rely on.
func ensureWorkersConsumer(ctx context.Context, st jetstream.Stream, c ProvisionConfig, r *Resources) (jetstream.Consumer, error) {
	want := WorkersConsumerConfig(c.Names, c.LeaseTTL, c.MaxAckPending, st.CachedInfo().Config.Replicas)
	// Likewise a process with a shorter lease TTL or a smaller pending
	// limit must not lower what running workers rely on.
	if old, err := st.Consumer(ctx, want.Durable); err == nil {
		if have := old.CachedInfo().Config; have.AckWait > want.AckWait || have.MaxAckPending > want.MaxAckPending {
			if have.AckWait > want.AckWait {
				r.Warnings = append(r.Warnings, fmt.Sprintf("consumer %s has ack wait %s, longer than this process's %s (lease ttl %s): kept %s", want.Durable, have.AckWait, want.AckWait, c.LeaseTTL, have.AckWait))
				want.AckWait = have.AckWait
			}
			want.MaxAckPending = max(want.MaxAckPending, have.MaxAckPending)
		}
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, want)
	if err != nil {
		return nil, fmt.Errorf("provision consumer %s on %s: %w", want.Durable, st.CachedInfo().Config.Name, err)
	}
	if err := AssertWorkersConsumer(ctx, cons, c.LeaseTTL); err != nil {
		return nil, err
	}
	return cons, nil
}

// WorkersConsumerConfig is the configuration of the shared workers consumer:
// explicit acks, never terminated (dead letters come from the lane protocol),
// no BackOff, AckWait above the lease TTL.
func WorkersConsumerConfig(n Names, leaseTTL time.Duration, maxAckPending, replicas int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       n.WorkersConsumer(),
		Description:   "agentfleet workers: wake-ups for lanes",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       WorkersAckWait(leaseTTL),
		MaxDeliver:    -1,
		MaxAckPending: maxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		// No filter: the stream's subjects are exactly its partitions (and
		// change during a migration).
		Replicas:   replicas,
		MaxWaiting: 512,
	}
}

// AssertWorkersConsumer checks the settings the lane protocol relies on.
func AssertWorkersConsumer(ctx context.Context, cons jetstream.Consumer, leaseTTL time.Duration) error {
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("workers consumer info: %w", err)
	}
	cfg := info.Config
	var errs []error
	if cfg.AckPolicy != jetstream.AckExplicitPolicy {
		errs = append(errs, fmt.Errorf("ack policy is %s, want explicit", cfg.AckPolicy))
	}
	if cfg.MaxDeliver != -1 {
		errs = append(errs, fmt.Errorf("max deliver is %d, want -1", cfg.MaxDeliver))
	}
	if len(cfg.BackOff) != 0 {
		errs = append(errs, fmt.Errorf("backoff is %v, want none", cfg.BackOff))
	}
	if cfg.AckWait < leaseTTL {
		errs = append(errs, fmt.Errorf("ack wait %s is below the lease ttl %s", cfg.AckWait, leaseTTL))
	}
	if len(errs) > 0 {
		return permanent(fmt.Errorf("workers consumer %s: %w", cfg.Durable, errors.Join(errs...)))
	}
	return nil
}

// existingReplicas is the replica count of an existing stream, 0 when it
// does not exist (or cannot be read: the create or update that follows
// reports the trouble).
func existingReplicas(ctx context.Context, js jetstream.JetStream, stream string) int {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0
	}
	return s.CachedInfo().Config.Replicas
}

func ensureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("provision stream %s: %w", cfg.Name, err)
	}
	return s, nil
}

// ensureInbox creates the inbox stream with a fresh identity, or updates it
// keeping the identity it has. Two processes racing to create it agree on
// one identity: the loser of the create re-reads the winner's.
func ensureInbox(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, string, error) {
	for attempt := 0; attempt < 5; attempt++ {
		s, err := js.Stream(ctx, cfg.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			var b [16]byte
			if _, err := rand.Read(b[:]); err != nil {
				return nil, "", err
			}
			id := hex.EncodeToString(b[:])
			create := cfg
			create.Metadata = map[string]string{InboxIDMetadata: id}
			s, err = js.CreateStream(ctx, create)
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				continue
			}
			if err != nil {
				return nil, "", fmt.Errorf("provision stream %s: %w", cfg.Name, err)
			}
			return s, id, nil
		}
		if err != nil {
			return nil, "", fmt.Errorf("provision stream %s: %w", cfg.Name, err)
		}
		info := s.CachedInfo()
		id := info.Config.Metadata[InboxIDMetadata]
		if id == "" {
			// A stream made by other means (by hand, restored): every
			// process starting now must settle on the same identity, so
			// derive it from the stream's creation instead of a random one.
			sum := sha256.Sum256([]byte(info.Config.Name + "\x00" + info.Created.UTC().Format(time.RFC3339Nano)))
			id = hex.EncodeToString(sum[:16])
		}
		if info.Config.Metadata[InboxIDMetadata] == id && inboxConfigCurrent(info.Config, cfg) {
			// Nothing to change: no update, so a process starting while a
			// migration moves partitions cannot write back subjects it read
			// a moment before the migration changed them.
			return s, id, nil
		}
		update := cfg
		update.Metadata = map[string]string{InboxIDMetadata: id}
		// The subjects of an existing inbox stream are the migration's to
		// change: a process provisioning from a map read a moment ago must
		// not give a partition back to the stream it is being moved from.
		update.Subjects = info.Config.Subjects
		s, err = js.UpdateStream(ctx, update)
		if err != nil {
			return nil, "", fmt.Errorf("provision stream %s: %w", cfg.Name, err)
		}
		return s, id, nil
	}
	return nil, "", fmt.Errorf("provision stream %s: could not settle its identity", cfg.Name)
}

// inboxConfigCurrent reports whether an existing inbox stream already has
// every setting provisioning gives it but its subjects (the migration's to
// change).
func inboxConfigCurrent(have, want jetstream.StreamConfig) bool {
	return have.Description == want.Description &&
		have.Retention == want.Retention &&
		have.Storage == want.Storage &&
		have.Replicas == want.Replicas &&
		(want.Duplicates == 0 || have.Duplicates == want.Duplicates) &&
		have.AllowDirect == want.AllowDirect &&
		reflect.DeepEqual(have.RePublish, want.RePublish)
}

// InboxID reads the identity of an existing inbox stream.
func InboxID(ctx context.Context, s jetstream.Stream) (string, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return "", err
	}
	id := info.Config.Metadata[InboxIDMetadata]
	if id == "" {
		return "", errors.New("inbox stream has no identity metadata; run provisioning")
	}
	return id, nil
}

// bind opens what provision would create, creating nothing.
func bind(ctx context.Context, js jetstream.JetStream, c ProvisionConfig) (*Resources, error) {
	n := c.Names
	r := &Resources{JS: js}
	missing := func(kind, name string, err error) error {
		if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
			return permanent(fmt.Errorf("%s %s does not exist, and this process only binds (nats.provision is false): %w", kind, name, ErrNotProvisioned))
		}
		return fmt.Errorf("bind %s %s: %w", kind, name, err)
	}
	streams := []struct {
		dst  *jetstream.Stream
		name string
	}{
		{&r.Inbox, n.InboxStream()}, {&r.Transcripts, n.TranscriptStream()}, {&r.Outbox, n.OutboxStream()},
		{&r.Events, n.EventStream()}, {&r.Probe, n.ProbeStream()},
	}
	for _, s := range streams {
		st, err := js.Stream(ctx, s.name)
		if err != nil {
			return nil, missing("stream", s.name, err)
		}
		*s.dst = st
	}
	r.InboxID = r.Inbox.CachedInfo().Config.Metadata[InboxIDMetadata]
	if r.InboxID == "" {
		return nil, permanent(fmt.Errorf("stream %s has no identity metadata %s, and this process only binds (nats.provision is false): %w", n.InboxStream(), InboxIDMetadata, ErrNotProvisioned))
	}
	kvs := []struct {
		dst  *jetstream.KeyValue
		name string
	}{
		{&r.Sessions, n.SessionsBucket()}, {&r.SessionIDs, n.SessionIDsBucket()}, {&r.Leases, n.LeasesBucket()},
		{&r.MsgIDs, n.MsgIDsBucket()}, {&r.Delivered, n.DeliveredBucket()}, {&r.Workers, n.WorkersBucket()},
	}
	for _, k := range kvs {
		kv, err := js.KeyValue(ctx, k.name)
		if err != nil {
			return nil, missing("bucket", k.name, err)
		}
		*k.dst = kv
	}
	cons, err := r.Inbox.Consumer(ctx, n.WorkersConsumer())
	if err != nil {
		return nil, missing("consumer", n.InboxStream()+"/"+n.WorkersConsumer(), err)
	}
	if err := AssertWorkersConsumer(ctx, cons, c.LeaseTTL); err != nil {
		return nil, err
	}
	r.Consumer = cons
	// The inbox map and every inbox stream it names, with their consumers
	// (a fleet provisioned before there was a map has its one stream).
	if r.Inboxes, err = OpenInboxes(ctx, js, n, true); err != nil {
		return nil, missing("inbox streams", n.InboxMapBucket(), err)
	}
	if m, _ := r.Inboxes.Map(); c.InboxStreams != 0 && c.InboxStreams != m.Count() {
		return nil, permanent(fmt.Errorf("%w: the fleet has %d inbox streams and this process is configured for %d (nats.inbox_streams); set it to %d or 0, or change the fleet's count with `fleetctl inbox streams %d`",
			ErrInboxStreams, m.Count(), c.InboxStreams, m.Count(), c.InboxStreams))
	}
	for _, in := range r.Inboxes.All() {
		if err := AssertWorkersConsumer(ctx, in.Consumer, c.LeaseTTL); err != nil {
			return nil, err
		}
	}
	return r, nil
}
