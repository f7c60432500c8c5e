package broker

import "strings"

// The prefixes of JetStream's advisories of a stream, or a consumer, made,
// deleted or changed (nats-server's JSAdvisoryStream*Pre and
// JSAdvisoryConsumer*Pre): the stream's name follows, then, for a consumer,
// the consumer's.
const (
	advisoryStream   = "$JS.EVENT.ADVISORY.STREAM."
	advisoryConsumer = "$JS.EVENT.ADVISORY.CONSUMER."
)

// The actions of the advisories InboxAdvisories names.
const (
	AdvisoryCreated = "CREATED"
	AdvisoryDeleted = "DELETED"
	AdvisoryUpdated = "UPDATED"
)

// InboxAdvisories are the subjects of the advisories that tell of an inbox
// stream made, deleted or changed, or of its workers consumer made or
// deleted: each one named, for every inbox stream a fleet can have
// (MaxInboxStreams), so that a subscriber hears of no other stream.
func (n Names) InboxAdvisories() []string {
	var out []string
	for _, s := range n.inboxStreams() {
		for _, a := range []string{AdvisoryCreated, AdvisoryDeleted, AdvisoryUpdated} {
			out = append(out, advisoryStream+a+"."+s)
		}
		for _, a := range []string{AdvisoryCreated, AdvisoryDeleted} {
			out = append(out, advisoryConsumer+a+"."+s+"."+n.WorkersConsumer())
		}
	}
	return out
}

// InboxAdvisory is what the subject of one of InboxAdvisories tells.
type InboxAdvisory struct {
	// Stream is the inbox stream the advisory is about.
	Stream string
	// Action is AdvisoryCreated, AdvisoryDeleted or AdvisoryUpdated.
	Action string
	// Consumer is set for an advisory of the stream's workers consumer.
	Consumer bool
}

// ParseInboxAdvisory reads the subject of an advisory InboxAdvisories
// names. ok is false for any other subject, and for a stream that is not
// one of the fleet's inbox streams.
func (n Names) ParseInboxAdvisory(subject string) (a InboxAdvisory, ok bool) {
	if rest, found := strings.CutPrefix(subject, advisoryStream); found {
		a.Action, a.Stream, _ = strings.Cut(rest, ".")
		if a.Action != AdvisoryCreated && a.Action != AdvisoryDeleted && a.Action != AdvisoryUpdated {
			return InboxAdvisory{}, false
		}
	} else if rest, found := strings.CutPrefix(subject, advisoryConsumer); found {
		var consumer string
		a.Action, rest, _ = strings.Cut(rest, ".")
		a.Stream, consumer, _ = strings.Cut(rest, ".")
		if (a.Action != AdvisoryCreated && a.Action != AdvisoryDeleted) || consumer != n.WorkersConsumer() {
			return InboxAdvisory{}, false
		}
		a.Consumer = true
	} else {
		return InboxAdvisory{}, false
	}
	if _, ok := n.InboxStreamIndex(a.Stream); !ok {
		return InboxAdvisory{}, false
	}
	return a, true
}
