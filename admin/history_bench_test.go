package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/admin"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
	"github.com/agentfleet/agentfleet/worker"
)

// BenchmarkReadHistory measures the Fleet page's read of the last hour
// (admin.ReadHistory over 20,000 turn-end events) beside its floor: one
// ordered consumer reading the same events and nothing else. It reports
// ns/event of each and their ratio.
//
//	go test -run '^$' -bench ReadHistory -benchtime 5x ./admin/
func BenchmarkReadHistory(b *testing.B) {
	const events = 20000
	srv := natstest.RunServer(b)
	nc := srv.Connect(b)
	js := natstest.JetStream(b, nc)
	names := broker.MustNames("fleet")
	ctx := context.Background()
	if _, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: names, LeaseTTL: 3 * time.Second}); err != nil {
		b.Fatal(err)
	}
	in, err := js.Publish(ctx, names.InboxSubject(0, "agent.main.http.dm.b"), []byte(`{}`))
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < events; i++ {
		data, _ := json.Marshal(worker.TurnEvent{Type: "end", Lane: "agent.main.http.dm.b", Status: "completed", FirstSeq: in.Sequence, At: time.Now()})
		if _, err := js.PublishAsync(names.EventSubject("turn", "agent.main.http.dm.b"), data); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		b.Fatal("publish the events")
	}
	fl, err := admin.Open(ctx, js, names)
	if err != nil {
		b.Fatal(err)
	}
	floor := func() int {
		start := time.Now().Add(-time.Hour)
		cons, err := js.OrderedConsumer(ctx, names.EventStream(), jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{names.EventSubject("turn", ">")}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for n < events {
			batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			for m := range batch.Messages() {
				var ev worker.TurnEvent
				_ = json.Unmarshal(m.Data(), &ev)
				n++
			}
			if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
				b.Fatal(err)
			}
		}
		return n
	}
	var floorNS, histNS time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if n := floor(); n != events {
			b.Fatalf("floor read %d events", n)
		}
		t1 := time.Now()
		h, err := fl.ReadHistory(ctx, admin.HistoryOptions{})
		if err != nil {
			b.Fatal(err)
		}
		histNS += time.Since(t1)
		floorNS += t1.Sub(t0)
		if h.Events != events {
			b.Fatalf("history read %d events", h.Events)
		}
	}
	b.ReportMetric(float64(histNS.Nanoseconds())/float64(b.N*events), "ns/event")
	b.ReportMetric(float64(floorNS.Nanoseconds())/float64(b.N*events), "floor-ns/event")
	b.ReportMetric(float64(histNS)/float64(floorNS), "x-floor")
}
