package broker_test

import (
	"testing"

	"github.com/agentfleet/agentfleet/broker"
)

// TestInboxAdvisory: the advisories of the fleet's inbox streams and their
// workers consumers are read, with whether they tell of a deletion; those
// of other streams and consumers, and other advisories, are not.
func TestInboxAdvisory(t *testing.T) {
	n := broker.MustNames("fleet")
	for _, c := range []struct {
		subject, stream string
		deleted, ok     bool
	}{
		{"$JS.EVENT.ADVISORY.STREAM.DELETED.FLEET_IN", "FLEET_IN", true, true},
		{"$JS.EVENT.ADVISORY.STREAM.CREATED.FLEET_IN_3", "FLEET_IN_3", false, true},
		{"$JS.EVENT.ADVISORY.STREAM.UPDATED.FLEET_IN_15", "FLEET_IN_15", false, true},
		{"$JS.EVENT.ADVISORY.CONSUMER.DELETED.FLEET_IN_2.workers", "FLEET_IN_2", true, true},
		{"$JS.EVENT.ADVISORY.CONSUMER.CREATED.FLEET_IN.workers", "FLEET_IN", false, true},
		{"$JS.EVENT.ADVISORY.STREAM.DELETED.FLEET_TX", "", false, false},
		{"$JS.EVENT.ADVISORY.STREAM.DELETED.FLEET_IN_16", "", false, false},
		{"$JS.EVENT.ADVISORY.STREAM.DELETED.OTHER_IN", "", false, false},
		{"$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.FLEET_IN", "", false, false},
		{"$JS.EVENT.ADVISORY.CONSUMER.DELETED.FLEET_IN.other", "", false, false},
		{"$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.FLEET_IN.workers", "", false, false},
		{"$JS.EVENT.ADVISORY.CONSUMER.DELETED.FLEET_IN", "", false, false},
		{"fleet.in.1.lane", "", false, false},
	} {
		stream, deleted, ok := n.InboxAdvisory(c.subject)
		if stream != c.stream || deleted != c.deleted || ok != c.ok {
			t.Errorf("%s: got %q %t %t, want %q %t %t", c.subject, stream, deleted, ok, c.stream, c.deleted, c.ok)
		}
	}
}
