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

// InboxAdvisories are the subjects of the advisories that tell of an inbox
// stream, or its workers consumer, made, deleted or changed. A subject
// token cannot be matched by a prefix, so they take those of every stream
// of the account: InboxAdvisory picks out the fleet's.
func (n Names) InboxAdvisories() []string {
	return []string{
		advisoryStream + "CREATED.*",
		advisoryStream + "DELETED.*",
		advisoryStream + "UPDATED.*",
		advisoryConsumer + "CREATED.*." + n.WorkersConsumer(),
		advisoryConsumer + "DELETED.*." + n.WorkersConsumer(),
	}
}

// InboxAdvisory reads the subject of an advisory InboxAdvisories matches:
// the inbox stream it is about, and whether it tells of a deletion (of the
// stream or of its workers consumer). ok is false for any other subject,
// and for a stream that is not one of the fleet's inbox streams.
func (n Names) InboxAdvisory(subject string) (stream string, deleted, ok bool) {
	var action, consumer string
	if rest, found := strings.CutPrefix(subject, advisoryStream); found {
		action, stream, _ = strings.Cut(rest, ".")
		if action != "CREATED" && action != "DELETED" && action != "UPDATED" {
			return "", false, false
		}
	} else if rest, found := strings.CutPrefix(subject, advisoryConsumer); found {
		action, rest, _ = strings.Cut(rest, ".")
		stream, consumer, _ = strings.Cut(rest, ".")
		if (action != "CREATED" && action != "DELETED") || consumer != n.WorkersConsumer() {
			return "", false, false
		}
	} else {
		return "", false, false
	}
	if _, ok := n.InboxStreamIndex(stream); !ok {
		return "", false, false
	}
	return stream, action == "DELETED", true
}
