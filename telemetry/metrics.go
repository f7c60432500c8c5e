package telemetry

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the fleet's instruments.
const ScopeName = "github.com/agentfleet/agentfleet"

// The names of the fleet's instruments (OTel style: dot-separated, units
// apart). The Prometheus endpoint shows them with dots as underscores, a
// _total suffix on counters and a _seconds suffix on durations.
const (
	MetricTurnsStarted     = "agentfleet.turn.started"
	MetricTurnsEnded       = "agentfleet.turn.ended"
	MetricTurnDuration     = "agentfleet.turn.duration"
	MetricTurnsResumed     = "agentfleet.turn.resumed"
	MetricRedeliveries     = "agentfleet.inbox.redeliveries"
	MetricLeaseAcquired    = "agentfleet.lease.acquired"
	MetricLeaseTakeovers   = "agentfleet.lease.takeovers"
	MetricCacheHits        = "agentfleet.agent.cache.hits"
	MetricCacheMisses      = "agentfleet.agent.cache.misses"
	MetricCacheEvictions   = "agentfleet.agent.cache.evictions"
	MetricAgentTokens      = "agentfleet.agent.tokens"
	MetricDeliveryAttempts = "agentfleet.delivery.attempts"
	MetricDeliveryFailures = "agentfleet.delivery.failures"
	MetricReplyLatency     = "agentfleet.reply.latency"
	MetricDeliveryGivenUp  = "agentfleet.delivery.given_up"
	MetricAgentCost        = "agentfleet.agent.cost"
	MetricLeaseLost        = "agentfleet.lease.lost"
)

// The attribute keys of the fleet's instruments.
const (
	// AttrTurnStatus is a turn_end status: completed, failed, interrupted,
	// stopped, dead_lettered.
	AttrTurnStatus = attribute.Key("agentfleet.turn.status")
	// AttrTokenType is input or output (as gen_ai.token.type).
	AttrTokenType = attribute.Key("gen_ai.token.type")
	// AttrPlatform is the platform a reply is delivered to.
	AttrPlatform = attribute.Key("agentfleet.platform")
)

// Metrics holds the fleet's instruments. A nil *Metrics is valid and
// records nothing: the fleet's components take one in their configuration
// and call it unconditionally, so metrics that are off cost a nil check.
type Metrics struct {
	turnsStarted, turnsEnded, turnsResumed       metric.Int64Counter
	turnDuration                                 metric.Float64Histogram
	redeliveries, leaseAcquired, leaseTakeovers  metric.Int64Counter
	cacheHits, cacheMisses, cacheEvictions       metric.Int64Counter
	agentTokens, deliveryAttempts, deliveryFails metric.Int64Counter

	replyLatency metric.Float64Histogram
	agentCost    metric.Float64Counter
	leaseLost    metric.Int64Counter
	meter        metric.Meter
	givenUp      metric.Int64Counter

	tokensIn, tokensOut metric.MeasurementOption
}

// NewMetrics creates the fleet's instruments on mp.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	m := mp.Meter(ScopeName)
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	x := &Metrics{
		turnsStarted:     counter(MetricTurnsStarted, "{turn}", "Turns started (a resumed attempt counts again)."),
		turnsEnded:       counter(MetricTurnsEnded, "{turn}", "Turns committed, by their turn_end status."),
		turnsResumed:     counter(MetricTurnsResumed, "{turn}", "Interrupted turns resumed (after a crash, a restart or an automatic resume)."),
		redeliveries:     counter(MetricRedeliveries, "{delivery}", "Inbox deliveries received again (JetStream delivery count above 1)."),
		leaseAcquired:    counter(MetricLeaseAcquired, "{lease}", "Lane leases acquired."),
		leaseTakeovers:   counter(MetricLeaseTakeovers, "{lease}", "Lanes taken over with a turn left in flight by a previous owner."),
		cacheHits:        counter(MetricCacheHits, "{agent}", "Turns that found their session's agent in the worker's cache."),
		cacheMisses:      counter(MetricCacheMisses, "{agent}", "Turns that had to build their session's agent."),
		cacheEvictions:   counter(MetricCacheEvictions, "{agent}", "Agents closed and dropped from the worker's cache."),
		agentTokens:      counter(MetricAgentTokens, "{token}", "Tokens the agents reported, by gen_ai.token.type."),
		deliveryAttempts: counter(MetricDeliveryAttempts, "{attempt}", "Reply delivery attempts, per platform."),
		deliveryFails:    counter(MetricDeliveryFailures, "{attempt}", "Reply delivery attempts that failed, per platform."),
		givenUp:          counter(MetricDeliveryGivenUp, "{reply}", "Replies given up after their retry budget (attempts or age) ran out, per platform."),
	}
	h, err := m.Float64Histogram(MetricTurnDuration, metric.WithUnit("s"),
		metric.WithDescription("Time from a turn's start to its commit, by status."),
		metric.WithExplicitBucketBoundaries(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
	errs = append(errs, err)
	x.turnDuration = h
	h, err = m.Float64Histogram(MetricReplyLatency, metric.WithUnit("s"),
		metric.WithDescription("Time from the ingress's acceptance of a turn's first message to the publish of the turn's reply."),
		metric.WithExplicitBucketBoundaries(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
	errs = append(errs, err)
	x.replyLatency = h
	x.meter = m
	x.leaseLost = counter(MetricLeaseLost, "{lease}", "Lane leases a live worker lost (taken over or expired while it was running): a spurious takeover when the worker was healthy.")
	cost, err := m.Float64Counter(MetricAgentCost, metric.WithUnit("USD"),
		metric.WithDescription("Estimated cost the agents reported, in US dollars (turns whose cost is unknown add nothing)."))
	errs = append(errs, err)
	x.agentCost = cost
	x.tokensIn = metric.WithAttributeSet(attribute.NewSet(AttrTokenType.String("input")))
	x.tokensOut = metric.WithAttributeSet(attribute.NewSet(AttrTokenType.String("output")))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	x.zero()
	return x, nil
}

// TurnStatuses are the turn_end statuses the ended-turns counter shows from
// the start, at zero until a turn ends so.
var TurnStatuses = []string{"completed", "failed", "interrupted", "stopped", "dead_lettered"}

// zero adds 0 to every counter with the attribute sets known up front, so
// that /metrics shows each series from the start: an alert on a rate or
// an increase sees the first event, and a dashboard references no series
// that is not there yet.
func (x *Metrics) zero() {
	ctx := context.Background()
	for _, c := range []metric.Int64Counter{x.turnsStarted, x.turnsResumed, x.redeliveries, x.leaseAcquired,
		x.leaseTakeovers, x.cacheHits, x.cacheMisses, x.cacheEvictions} {
		c.Add(ctx, 0)
	}
	for _, s := range TurnStatuses {
		x.turnsEnded.Add(ctx, 0, metric.WithAttributeSet(attribute.NewSet(AttrTurnStatus.String(s))))
	}
	for _, r := range []string{"taken", "expired"} {
		x.leaseLost.Add(ctx, 0, metric.WithAttributeSet(attribute.NewSet(attribute.String("agentfleet.lease.loss_reason", r))))
	}
	x.agentTokens.Add(ctx, 0, x.tokensIn)
	x.agentTokens.Add(ctx, 0, x.tokensOut)
	x.agentCost.Add(ctx, 0)
}

// PlatformDelivery shows the delivery counters of platform from the start
// (at zero); a delivery consumer calls it when it is set up.
func (m *Metrics) PlatformDelivery(platform string) {
	if m == nil {
		return
	}
	ctx := context.Background()
	opt := metric.WithAttributeSet(attribute.NewSet(AttrPlatform.String(platform)))
	m.deliveryAttempts.Add(ctx, 0, opt)
	m.deliveryFails.Add(ctx, 0, opt)
	m.givenUp.Add(ctx, 0, opt)
}

// TurnStarted counts a turn (or a resumed attempt of one) starting.
func (m *Metrics) TurnStarted(ctx context.Context) {
	if m == nil {
		return
	}
	m.turnsStarted.Add(ctx, 1)
}

// TurnEnded counts a committed turn by its status and records its duration
// since started (none when started is zero).
func (m *Metrics) TurnEnded(ctx context.Context, status string, started time.Time) {
	if m == nil {
		return
	}
	opt := metric.WithAttributeSet(attribute.NewSet(AttrTurnStatus.String(status)))
	m.turnsEnded.Add(ctx, 1, opt)
	if !started.IsZero() {
		m.turnDuration.Record(ctx, time.Since(started).Seconds(), opt)
	}
}

// TurnResumed counts an interrupted turn resumed.
func (m *Metrics) TurnResumed(ctx context.Context) {
	if m != nil {
		m.turnsResumed.Add(ctx, 1)
	}
}

// Redelivered counts an inbox message delivered again.
func (m *Metrics) Redelivered(ctx context.Context) {
	if m != nil {
		m.redeliveries.Add(ctx, 1)
	}
}

// LeaseAcquired counts a lane lease acquired.
func (m *Metrics) LeaseAcquired(ctx context.Context) {
	if m != nil {
		m.leaseAcquired.Add(ctx, 1)
	}
}

// LeaseTakeover counts a lane taken over with a previous owner's turn in
// flight.
func (m *Metrics) LeaseTakeover(ctx context.Context) {
	if m != nil {
		m.leaseTakeovers.Add(ctx, 1)
	}
}

// CacheLookup counts an agent cache hit or miss.
func (m *Metrics) CacheLookup(ctx context.Context, hit bool) {
	if m == nil {
		return
	}
	if hit {
		m.cacheHits.Add(ctx, 1)
		return
	}
	m.cacheMisses.Add(ctx, 1)
}

// CacheEvicted counts n agents evicted from the cache.
func (m *Metrics) CacheEvicted(ctx context.Context, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.cacheEvictions.Add(ctx, int64(n))
}

// AgentTokens counts the tokens a turn's agent reported.
func (m *Metrics) AgentTokens(ctx context.Context, input, output int64) {
	if m == nil {
		return
	}
	if input > 0 {
		m.agentTokens.Add(ctx, input, m.tokensIn)
	}
	if output > 0 {
		m.agentTokens.Add(ctx, output, m.tokensOut)
	}
}

// DeliveryAttempt counts a reply delivery attempt to platform, and a
// failure when err is not nil.
func (m *Metrics) DeliveryAttempt(ctx context.Context, platform string, err error) {
	if m == nil {
		return
	}
	opt := metric.WithAttributeSet(attribute.NewSet(AttrPlatform.String(platform)))
	m.deliveryAttempts.Add(ctx, 1, opt)
	if err != nil {
		m.deliveryFails.Add(ctx, 1, opt)
	}
}

// ReplyLatency records the time from a turn's first message's acceptance
// to its reply's publish.
func (m *Metrics) ReplyLatency(ctx context.Context, d time.Duration) {
	if m != nil {
		m.replyLatency.Record(ctx, d.Seconds())
	}
}

// DeliveryGivenUp counts a reply to platform given up: its retry budget
// ran out, or the platform refused it for good.
func (m *Metrics) DeliveryGivenUp(ctx context.Context, platform string) {
	if m != nil {
		m.givenUp.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(AttrPlatform.String(platform))))
	}
}

// AgentCost adds a turn's estimated cost in US dollars (nothing when zero
// or negative).
func (m *Metrics) AgentCost(ctx context.Context, usd float64) {
	if m != nil && usd > 0 {
		m.agentCost.Add(ctx, usd)
	}
}

// LeaseLost counts a lane lease a running worker lost; reason is "taken"
// (another owner holds it) or "expired" (it could not be renewed in time).
func (m *Metrics) LeaseLost(ctx context.Context, reason string) {
	if m != nil {
		m.leaseLost.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(attribute.String("agentfleet.lease.loss_reason", reason))))
	}
}
