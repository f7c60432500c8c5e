package telemetry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/agentfleet/agentfleet/telemetry"
)

// BenchmarkTurnHooks measures the hooks a turn calls (start, end with its
// duration, tokens, one delivery attempt): off (nil Metrics, the default)
// beside on (an SDK meter provider with a manual reader).
func BenchmarkTurnHooks(b *testing.B) {
	ctx := context.Background()
	run := func(b *testing.B, m *telemetry.Metrics) {
		started := time.Now()
		err := errors.New("x")
		b.ReportAllocs()
		for b.Loop() {
			m.TurnStarted(ctx)
			m.TurnEnded(ctx, "completed", started)
			m.AgentTokens(ctx, 10, 5)
			m.DeliveryAttempt(ctx, "http", err)
		}
	}
	b.Run("off", func(b *testing.B) { run(b, nil) })
	b.Run("on", func(b *testing.B) {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		defer mp.Shutdown(ctx) //nolint:errcheck
		m, err := telemetry.NewMetrics(mp)
		if err != nil {
			b.Fatal(err)
		}
		run(b, m)
	})
}
