package telemetry

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The names of the inbox backlog gauges.
const (
	// MetricInboxBacklog is, per inbox partition, the messages accepted
	// and not yet handled: on every lane of the partition, the inbox
	// messages above the lane's committed seq (the messages of a turn
	// running now included, until it commits).
	MetricInboxBacklog = "agentfleet.inbox.backlog"
	// MetricInboxBacklogLanes is, per inbox partition, the lanes with a
	// backlog.
	MetricInboxBacklogLanes = "agentfleet.inbox.backlog.lanes"
)

// AttrPartition is an inbox partition, 0 to 63.
const AttrPartition = attribute.Key("agentfleet.partition")

// Backlog is the inbox backlog of every partition, indexed by partition.
type Backlog struct {
	Messages, Lanes []int64
}

// ObserveBacklog registers the inbox backlog gauges, read at each
// collection from backlog. When backlog reports false (this process does
// not compute the backlog now, or has not finished its first count) the
// gauges have no series. Call the returned function to unregister them.
func (m *Metrics) ObserveBacklog(backlog func() (Backlog, bool)) (func() error, error) {
	if m == nil {
		return func() error { return nil }, nil
	}
	mt := m.meter
	msgs, err1 := mt.Int64ObservableGauge(MetricInboxBacklog, metric.WithUnit("{message}"),
		metric.WithDescription("Inbox messages accepted and not yet handled (above their lane's committed seq), per partition; exported by the watcher's leader only."))
	lanes, err2 := mt.Int64ObservableGauge(MetricInboxBacklogLanes, metric.WithUnit("{lane}"),
		metric.WithDescription("Lanes with inbox messages not yet handled, per partition; exported by the watcher's leader only."))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	reg, err := mt.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		b, ok := backlog()
		if !ok {
			return nil
		}
		for p := range b.Messages {
			opt := metric.WithAttributeSet(attribute.NewSet(AttrPartition.Int(p)))
			o.ObserveInt64(msgs, b.Messages[p], opt)
			if p < len(b.Lanes) {
				o.ObserveInt64(lanes, b.Lanes[p], opt)
			}
		}
		return nil
	}, msgs, lanes)
	if err != nil {
		return nil, err
	}
	return reg.Unregister, nil
}
