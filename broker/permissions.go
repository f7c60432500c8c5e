package broker

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// Roles a NATS user can have. Each role but RoleAdmin and RoleSystem is
// allowed only the subjects its processes use (see Permissions); the table
// in docs/security.md is generated from the same function.
const (
	// RoleAdmin may do anything in the fleet's account: fleetctl, and the
	// provisioning step (`agentfleet provision`) that creates the streams,
	// buckets and durable consumers.
	RoleAdmin = "admin"
	// RoleIngress is `agentfleet ingress` without the console: it publishes
	// to the inbox, reads replies and delivers them.
	RoleIngress = "ingress"
	// RoleConsole is an ingress that also serves the operations console,
	// which reads transcripts, events and the state database.
	RoleConsole = "console"
	// RoleWorker is `agentfleet worker`.
	RoleWorker = "worker"
	// RoleIndexer is `agentfleet indexer` and its fleet.api service.
	RoleIndexer = "indexer"
	// RoleHealthcheck is `agentfleet healthcheck` (--nats, --worker, --indexer).
	RoleHealthcheck = "healthcheck"
	// RoleSystem is a user of the server's system account, for the nats
	// CLI's server commands (`nats server report jetstream`). It sees no
	// fleet subject.
	RoleSystem = "system"
)

// Roles lists every role, admin first.
func Roles() []string {
	return []string{RoleAdmin, RoleIngress, RoleConsole, RoleWorker, RoleIndexer, RoleHealthcheck, RoleSystem}
}

// DefaultInboxPrefix is the prefix of the reply subjects of a NATS client
// that sets none.
const DefaultInboxPrefix = "_INBOX"

// Permissions returns the publish and subscribe permissions of role in a
// fleet named by n. inboxPrefix is the prefix of the role's reply subjects
// (nats.inbox_prefix; empty is DefaultInboxPrefix). It returns nil for
// RoleAdmin and RoleSystem, which are not restricted (RoleSystem lives in
// another account).
//
// The sets were derived by running each role against a server enforcing
// them and reading the permission violations its connection reported
// (cmd/agentfleet's TestRolesRunUnderTheirPermissions fails on any), and
// from the code paths that test does not reach (dead-letter actions of the
// console, the worker's resume lookup in the state database).
func Permissions(role string, n Names, inboxPrefix string) (*server.Permissions, error) {
	if inboxPrefix == "" {
		inboxPrefix = DefaultInboxPrefix
	}
	if err := checkInboxPrefix(inboxPrefix); err != nil {
		return nil, err
	}
	p := &perms{n: n}
	p.sub(inboxPrefix + ".>")
	// Every role reads JetStream's account information (readiness) and
	// the configuration of the fleet's streams and buckets (binding).
	p.pub("$JS.API.INFO")
	for _, s := range n.allStreams() {
		p.pub("$JS.API.STREAM.INFO." + s)
	}
	// Every inbox stream there can be (nats.inbox_streams): a stream name
	// cannot be matched by a wildcard in a subject token.
	ins := n.inboxStreams()
	for _, s := range ins {
		p.pub("$JS.API.CONSUMER.INFO." + s + "." + n.WorkersConsumer())
	}
	// Every role that binds reads the inbox map (which stream holds which
	// partition).
	p.kvRead(n.InboxMapBucket())
	tx, out, ev, probe := n.TranscriptStream(), n.OutboxStream(), n.EventStream(), n.ProbeStream()
	switch role {
	case RoleAdmin, RoleSystem:
		return nil, nil
	case RoleIngress, RoleConsole:
		p.pub(n.InboxWildcard(), n.BoxWildcard(), n.ProbeSubject(), n.EventWildcard())
		p.sub(n.BoxHintWildcard(), n.DeltaWildcard())
		p.readStream(out, probe)
		p.readStream(ins...)
		// The delivery consumers, one per platform (deliver_<platform>),
		// made by the ingress; the consumer metrics list them.
		p.durable(out, "*", true)
		p.pub("$JS.API.CONSUMER.LIST." + out)
		for _, s := range ins {
			p.pub("$JS.API.CONSUMER.LIST." + s)
		}
		// Message ids, delivered replies, the leases of singleton platform
		// connections; reads of session records and the worker registry.
		p.kvWrite(n.MsgIDsBucket(), n.DeliveredBucket(), n.LeasesBucket())
		p.kvRead(n.SessionsBucket(), n.WorkersBucket(), n.InboxMapBucket())
		p.service()
		if role == RoleConsole {
			// The console's pages read transcripts, events, dead letters
			// and the state database; its actions break leases (above),
			// publish commands (the inbox, above) and delete dead letters.
			p.readStream(tx, ev)
			p.ordered(tx, ev)
			p.kvRead(n.SessionIDsBucket())
			p.pub(n.APIPrefix()+".>", "$SRV.>", "$JS.API.STREAM.MSG.DELETE."+ev, "$JS.API.STREAM.PURGE."+ev)
		}
	case RoleWorker:
		// Transcripts, replies, events, dead letters, streamed deltas,
		// cache evictions, deliveries forwarded to a lane's holder, and
		// internal messages into lanes' inboxes.
		p.pub(n.TranscriptWildcard(), n.OutboxWildcard(), n.EventWildcard(), n.DeadLetterWildcard(),
			n.DeltaWildcard(), n.EvictSubject(), n.ForwardWildcard(), n.InboxWildcard())
		p.sub(n.HintWildcard(), n.EvictSubject(), n.ForwardWildcard())
		// JetStream's advisories of streams and workers consumers made or
		// deleted: a worker reopens an inbox stream deleted and made again
		// at once (they name any stream of the account: the worker picks
		// out the fleet's inbox streams).
		p.sub(n.InboxAdvisories()...)
		p.readStream(tx, out, ev)
		p.readStream(ins...)
		for _, s := range ins {
			p.durable(s, n.WorkersConsumer(), false)
		}
		p.kvRead(n.InboxMapBucket())
		p.ordered(tx)
		p.kvWrite(n.SessionsBucket(), n.SessionIDsBucket(), n.LeasesBucket(), n.WorkersBucket(), n.MsgIDsBucket())
		// Resuming a session asks the state database (statedb.EndpointSessions).
		p.pub(n.APISubject("sessions"))
		p.service()
	case RoleIndexer:
		p.readStream(tx, ev)
		p.durable(tx, "*", true)
		p.durable(ev, "*", true)
		// A rebuild replaces its consumers; the consumer metrics list them.
		p.pub("$JS.API.CONSUMER.DELETE."+tx+".*", "$JS.API.CONSUMER.DELETE."+ev+".*",
			"$JS.API.CONSUMER.LIST."+tx, "$JS.API.CONSUMER.LIST."+ev)
		p.kvRead(n.SessionsBucket(), n.SessionIDsBucket())
		p.sub(n.APIPrefix() + ".>")
		p.service()
	case RoleHealthcheck:
		p.kvRead(n.WorkersBucket())
		p.pub(n.APIPrefix() + ".>")
	default:
		return nil, fmt.Errorf("role %q: want one of %s", role, strings.Join(Roles(), ", "))
	}
	return p.permissions(), nil
}

func checkInboxPrefix(s string) error {
	if s == "" || strings.ContainsAny(s, " \t\r\n*>") || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") || strings.Contains(s, "..") {
		return fmt.Errorf("inbox prefix %q: want subject tokens without wildcards, such as _INBOX_worker", s)
	}
	return nil
}

// allStreams are the streams every role may read the configuration of.
func (n Names) allStreams() []string {
	s := append(n.inboxStreams(), n.TranscriptStream(), n.OutboxStream(), n.EventStream(), n.ProbeStream())
	for _, b := range n.allBuckets() {
		s = append(s, "KV_"+b)
	}
	return s
}

func (n Names) allBuckets() []string {
	return []string{n.SessionsBucket(), n.SessionIDsBucket(), n.LeasesBucket(), n.MsgIDsBucket(), n.DeliveredBucket(), n.WorkersBucket(), n.InboxMapBucket()}
}

// inboxStreams are the names of every inbox stream a fleet can have.
func (n Names) inboxStreams() []string {
	out := make([]string, MaxInboxStreams)
	for i := range out {
		out[i] = n.InboxStreamAt(i)
	}
	return out
}

type perms struct {
	n          Names
	pubs, subs []string
	responses  bool
}

func (p *perms) pub(s ...string) { p.pubs = append(p.pubs, s...) }
func (p *perms) sub(s ...string) { p.subs = append(p.subs, s...) }

// readStream allows reading messages of streams by sequence or subject
// (direct get, and the stream's own get for a stream without direct).
func (p *perms) readStream(streams ...string) {
	for _, s := range streams {
		p.pub("$JS.API.DIRECT.GET."+s, "$JS.API.DIRECT.GET."+s+".>", "$JS.API.STREAM.MSG.GET."+s)
	}
}

// ordered allows ordered (ephemeral, unacknowledged) consumers on streams:
// KV watches, stream reads in order.
func (p *perms) ordered(streams ...string) {
	for _, s := range streams {
		p.pub("$JS.API.CONSUMER.CREATE."+s, "$JS.API.CONSUMER.CREATE."+s+".>",
			"$JS.API.CONSUMER.DELETE."+s+".>", "$JS.API.CONSUMER.INFO."+s+".>", "$JS.API.CONSUMER.MSG.NEXT."+s+".>",
			"$JS.FC."+s+".>")
	}
}

// durable allows pulling and acknowledging from the durable consumer name
// (a token wildcard allowed) of stream, and with create true making it.
func (p *perms) durable(stream, name string, create bool) {
	p.pub("$JS.API.CONSUMER.INFO."+stream+"."+name, "$JS.API.CONSUMER.MSG.NEXT."+stream+"."+name, "$JS.ACK."+stream+".>")
	if create {
		p.pub("$JS.API.CONSUMER.CREATE."+stream+"."+name, "$JS.API.CONSUMER.CREATE."+stream+"."+name+".>",
			"$JS.API.CONSUMER.DURABLE.CREATE."+stream+"."+name)
	}
}

// kvRead allows getting keys of buckets and watching them.
func (p *perms) kvRead(buckets ...string) {
	for _, b := range buckets {
		p.readStream("KV_" + b)
		p.ordered("KV_" + b)
	}
}

// kvWrite is kvRead plus putting, updating and deleting keys.
func (p *perms) kvWrite(buckets ...string) {
	p.kvRead(buckets...)
	for _, b := range buckets {
		p.pub("$KV." + b + ".>")
	}
}

// service allows a NATS micro service: answering requests on its own
// subjects and the $SRV discovery subjects.
func (p *perms) service() {
	p.sub("$SRV.>", p.n.Prefix()+".svc.>")
	p.responses = true
}

func (p *perms) permissions() *server.Permissions {
	out := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: dedupe(p.pubs)},
		Subscribe: &server.SubjectPermission{Allow: dedupe(p.subs)},
	}
	if p.responses {
		// One reply per request, within the default time.
		out.Response = &server.ResponsePermission{MaxMsgs: server.DEFAULT_ALLOW_RESPONSE_MAX_MSGS, Expires: server.DEFAULT_ALLOW_RESPONSE_EXPIRATION}
	}
	return out
}

func dedupe(s []string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	return slices.Compact(out)
}
