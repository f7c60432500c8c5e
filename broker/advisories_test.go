package broker_test

import (
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/broker"
)

// TestInboxAdvisory: the advisories of the fleet's inbox streams and their
// workers consumers are read, with their action and whether they are of
// the consumer; those of other streams and consumers, and other
// advisories, are not.
func TestInboxAdvisory(t *testing.T) {
	n := broker.MustNames("fleet")
	for _, c := range []struct {
		subject string
		want    broker.InboxAdvisory
		ok      bool
	}{
		{"$JS.EVENT.ADVISORY.STREAM.DELETED.FLEET_IN", broker.InboxAdvisory{Stream: "FLEET_IN", Action: "DELETED"}, true},
		{"$JS.EVENT.ADVISORY.STREAM.CREATED.FLEET_IN_3", broker.InboxAdvisory{Stream: "FLEET_IN_3", Action: "CREATED"}, true},
		{"$JS.EVENT.ADVISORY.STREAM.UPDATED.FLEET_IN_15", broker.InboxAdvisory{Stream: "FLEET_IN_15", Action: "UPDATED"}, true},
		{"$JS.EVENT.ADVISORY.CONSUMER.DELETED.FLEET_IN_2.workers", broker.InboxAdvisory{Stream: "FLEET_IN_2", Action: "DELETED", Consumer: true}, true},
		{"$JS.EVENT.ADVISORY.CONSUMER.CREATED.FLEET_IN.workers", broker.InboxAdvisory{Stream: "FLEET_IN", Action: "CREATED", Consumer: true}, true},
		{"$JS.EVENT.ADVISORY.STREAM.DELETED.FLEET_TX", broker.InboxAdvisory{}, false},
		{"$JS.EVENT.ADVISORY.STREAM.DELETED.FLEET_IN_16", broker.InboxAdvisory{}, false},
		{"$JS.EVENT.ADVISORY.STREAM.DELETED.OTHER_IN", broker.InboxAdvisory{}, false},
		{"$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.FLEET_IN", broker.InboxAdvisory{}, false},
		{"$JS.EVENT.ADVISORY.CONSUMER.DELETED.FLEET_IN.other", broker.InboxAdvisory{}, false},
		{"$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.FLEET_IN.workers", broker.InboxAdvisory{}, false},
		{"$JS.EVENT.ADVISORY.CONSUMER.DELETED.FLEET_IN", broker.InboxAdvisory{}, false},
		{"fleet.in.1.lane", broker.InboxAdvisory{}, false},
	} {
		got, ok := n.ParseInboxAdvisory(c.subject)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: got %+v %t, want %+v %t", c.subject, got, ok, c.want, c.ok)
		}
	}
}

// TestInboxAdvisoriesNamed: the advisory subjects are named one by one, no
// wildcard (a subscriber hears of no stream but the fleet's inbox
// streams), five for each inbox stream a fleet can have, and each reads
// back as its stream's.
func TestInboxAdvisoriesNamed(t *testing.T) {
	n := broker.MustNames("fleet")
	subjects := n.InboxAdvisories()
	if len(subjects) != 5*broker.MaxInboxStreams {
		t.Errorf("%d subjects, want %d", len(subjects), 5*broker.MaxInboxStreams)
	}
	per := map[string]int{}
	for _, s := range subjects {
		if strings.ContainsAny(s, "*>") {
			t.Errorf("%s: a wildcard", s)
		}
		a, ok := n.ParseInboxAdvisory(s)
		if !ok {
			t.Errorf("%s: not read back", s)
			continue
		}
		per[a.Stream]++
	}
	for i := range broker.MaxInboxStreams {
		if s := n.InboxStreamAt(i); per[s] != 5 {
			t.Errorf("%s: %d subjects, want 5", s, per[s])
		}
	}
}
