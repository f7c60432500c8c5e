package provider_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/telemetry/provider"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// backlogs reads agentfleet_inbox_backlog (or another per-partition gauge)
// by partition.
func backlogs(fams map[string]*dto.MetricFamily, name string) map[int]float64 {
	out := map[int]float64{}
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "agentfleet_partition" {
				p, _ := strconv.Atoi(l.GetValue())
				out[p] += m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestInboxBacklogPerPartition stalls one lane (busy mode queue, an agent
// run that sleeps, three messages behind it) while another lane is
// answered, and reads agentfleet_inbox_backlog from /metrics with the
// Prometheus text parser: 4 on the stalled lane's partition (the running
// turn's message and the three queued), 0 on the 63 others, the answered
// lane's included. A /stop then lets the lane drain, and its partition goes
// back to 0.
func TestInboxBacklogPerPartition(t *testing.T) {
	p, err := provider.New(t.Context(), provider.Config{ServiceName: "agentfleet-test", Version: "test", Prometheus: true,
		Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	f := startFleet(t, p)

	part := func(key string) int { return session.Partition("fleet", session.LaneToken(key)) }
	doneKey, _ := f.send(t, "backlog-done", "hello", 0)
	// The stalled chat: the first whose lane is in another partition than
	// the answered one's, in busy mode queue (so the messages behind the
	// running turn wait for it rather than interrupt it).
	var stalled, stalledKey string
	for i := 0; stalledKey == "" || part(stalledKey) == part(doneKey); i++ {
		stalled = fmt.Sprintf("backlog-stalled-%d", i)
		stalledKey, _ = f.send(t, stalled, "/busy queue", 0)
	}
	f.post(t, stalled, "!sleep 10m")
	for i := range 3 {
		f.post(t, stalled, fmt.Sprintf("queued %d", i))
	}
	ps, pd := part(stalledKey), part(doneKey)

	check := func(want int) func() error {
		return func() error {
			fams, err := scrape(f.hc, f.base+"/metrics")
			if err != nil {
				return err
			}
			msgs, lanes := backlogs(fams, "agentfleet_inbox_backlog"), backlogs(fams, "agentfleet_inbox_backlog_lanes")
			if len(msgs) != broker.Partitions || len(lanes) != broker.Partitions {
				return fmt.Errorf("%d partitions in agentfleet_inbox_backlog, %d in _lanes; want %d", len(msgs), len(lanes), broker.Partitions)
			}
			for q := range broker.Partitions {
				wantMsgs, wantLanes := 0.0, 0.0
				if q == ps && want > 0 {
					wantMsgs, wantLanes = float64(want), 1
				}
				if msgs[q] != wantMsgs || lanes[q] != wantLanes {
					return fmt.Errorf("partition %d (stalled lane in %d, answered lane in %d): backlog %v messages on %v lanes, want %v on %v",
						q, ps, pd, msgs[q], lanes[q], wantMsgs, wantLanes)
				}
			}
			return nil
		}
	}
	natstest.WaitFor(t, waitTimeout, "a backlog of 4 on the stalled lane's partition", check(4))
	// /stop cancels the sleeping turn; the queued messages run after it.
	f.post(t, stalled, "/stop")
	natstest.WaitFor(t, waitTimeout, "no backlog left", check(0))
}
