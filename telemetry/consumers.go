package telemetry

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The names of the JetStream consumer gauges.
const (
	// MetricConsumerPending is a consumer's messages not yet delivered: on
	// the inbox stream's workers consumer, the fleet's backlog; on an
	// indexer consumer, the indexer's lag.
	MetricConsumerPending = "agentfleet.consumer.pending"
	// MetricConsumerAckPending is a consumer's messages delivered and not
	// yet acknowledged (on the workers consumer: turns in hand and held).
	MetricConsumerAckPending = "agentfleet.consumer.ack_pending"
	// MetricConsumerRedelivered is a consumer's messages delivered more
	// than once and not yet acknowledged.
	MetricConsumerRedelivered = "agentfleet.consumer.redelivered"
)

// The attribute keys of the consumer gauges.
const (
	AttrStream   = attribute.Key("messaging.nats.stream")
	AttrConsumer = attribute.Key("messaging.consumer.group.name")
)

// ConsumerState is one durable consumer's state, as its info reports it.
type ConsumerState struct {
	Stream, Consumer                 string
	Pending, AckPending, Redelivered uint64
}

// ObserveConsumers registers the consumer gauges, read at each collection
// (a Prometheus scrape, an OTLP export) from states. Call the returned
// function to unregister them.
func (m *Metrics) ObserveConsumers(states func(context.Context) ([]ConsumerState, error)) (func() error, error) {
	if m == nil {
		return func() error { return nil }, nil
	}
	mt := m.meter
	pending, err1 := mt.Int64ObservableGauge(MetricConsumerPending, metric.WithUnit("{message}"),
		metric.WithDescription("JetStream consumer messages not yet delivered (the workers consumer: the inbox backlog; an indexer consumer: its lag)."))
	ack, err2 := mt.Int64ObservableGauge(MetricConsumerAckPending, metric.WithUnit("{message}"),
		metric.WithDescription("JetStream consumer messages delivered and not yet acknowledged."))
	redel, err3 := mt.Int64ObservableGauge(MetricConsumerRedelivered, metric.WithUnit("{message}"),
		metric.WithDescription("JetStream consumer messages delivered more than once and not yet acknowledged."))
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, err
	}
	reg, err := mt.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		list, err := states(ctx)
		for _, s := range list {
			opt := metric.WithAttributeSet(attribute.NewSet(AttrStream.String(s.Stream), AttrConsumer.String(s.Consumer)))
			o.ObserveInt64(pending, int64(s.Pending), opt)
			o.ObserveInt64(ack, int64(s.AckPending), opt)
			o.ObserveInt64(redel, int64(s.Redelivered), opt)
		}
		return err
	}, pending, ack, redel)
	if err != nil {
		return nil, err
	}
	return reg.Unregister, nil
}

// ConsumerStates returns a states function for ObserveConsumers over the
// durable consumers of streams on js (the fleet's inbox, outbox, event and
// transcript streams). Ephemeral consumers (readers, benches) are left out.
func ConsumerStates(js jetstream.JetStream, streams ...string) func(context.Context) ([]ConsumerState, error) {
	return func(ctx context.Context) ([]ConsumerState, error) {
		var out []ConsumerState
		var errs []error
		for _, name := range streams {
			st, err := js.Stream(ctx, name)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			l := st.ListConsumers(ctx)
			for ci := range l.Info() {
				if ci.Config.Durable == "" || strings.HasPrefix(ci.Name, "_") {
					continue
				}
				out = append(out, ConsumerState{Stream: name, Consumer: ci.Name, Pending: ci.NumPending,
					AckPending: uint64(ci.NumAckPending), Redelivered: uint64(ci.NumRedelivered)})
			}
			if err := l.Err(); err != nil {
				errs = append(errs, err)
			}
		}
		return out, errors.Join(errs...)
	}
}

// The names of a worker's gauges.
const (
	MetricWorkerLanes   = "agentfleet.worker.lanes"
	MetricWorkerTurns   = "agentfleet.worker.turns.running"
	MetricCacheSize     = "agentfleet.agent.cache.size"
	MetricWatcherLeader = "agentfleet.watcher.leader"
)

// AttrWorker is a worker's id.
const AttrWorker = attribute.Key("agentfleet.worker.id")

// WorkerGauges is a worker's state at a collection.
type WorkerGauges struct {
	LanesOwned, TurnsRunning, CacheSize int
	// WatcherLeader is true on the worker leading the expiry watcher.
	WatcherLeader bool
}

// ObserveWorker registers the gauges of worker id, read from state at each
// collection. Call the returned function to unregister them (when the
// worker stops).
func (m *Metrics) ObserveWorker(id string, state func() WorkerGauges) (func() error, error) {
	if m == nil {
		return func() error { return nil }, nil
	}
	mt := m.meter
	lanes, err1 := mt.Int64ObservableGauge(MetricWorkerLanes, metric.WithUnit("{lane}"), metric.WithDescription("Lanes the worker owns."))
	turns, err2 := mt.Int64ObservableGauge(MetricWorkerTurns, metric.WithUnit("{turn}"), metric.WithDescription("Agent runs in progress on the worker."))
	cache, err3 := mt.Int64ObservableGauge(MetricCacheSize, metric.WithUnit("{agent}"), metric.WithDescription("Agents in the worker's cache."))
	leader, err4 := mt.Int64ObservableGauge(MetricWatcherLeader, metric.WithUnit("{leader}"),
		metric.WithDescription("1 on the worker that leads the expiry watcher, else 0; the fleet's sum is 1 when a watcher runs."))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, err
	}
	opt := metric.WithAttributeSet(attribute.NewSet(AttrWorker.String(id)))
	reg, err := mt.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := state()
		o.ObserveInt64(lanes, int64(s.LanesOwned), opt)
		o.ObserveInt64(turns, int64(s.TurnsRunning), opt)
		o.ObserveInt64(cache, int64(s.CacheSize), opt)
		var l int64
		if s.WatcherLeader {
			l = 1
		}
		o.ObserveInt64(leader, l, opt)
		return nil
	}, lanes, turns, cache, leader)
	if err != nil {
		return nil, err
	}
	return reg.Unregister, nil
}
