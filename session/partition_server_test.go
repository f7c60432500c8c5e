package session_test

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/agentfleet/agentfleet/session"
)

// TestPartitionMatchesServerTransform proves the design's claim that
// Partition is what the server's partition(64) subject transform computes
// for <prefix>.in.<lane>, so the assignment can later move into the server.
func TestPartitionMatchesServerTransform(t *testing.T) {
	t.Parallel()
	tr, err := server.NewSubjectTransform("fleet.in.>", "p.{{partition(64)}}.>")
	if err != nil {
		t.Fatalf("NewSubjectTransform: %v", err)
	}
	for i := range 500 {
		lane := session.LaneToken(fmt.Sprintf("agent:main:whatsapp:group:1203630%d@g.us:%d", i, i*13))
		got, err := tr.Match("fleet.in." + lane)
		if err != nil {
			t.Fatalf("Match: %v", err)
		}
		if want := fmt.Sprintf("p.%d.%s", session.Partition("fleet", lane), lane); got != want {
			t.Fatalf("server partition of %q = %s, Partition = %s", lane, got, want)
		}
	}
}
