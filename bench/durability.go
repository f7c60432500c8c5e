package bench

import "context"

// DurabilityRow compares, at one lane count, the throughput scenario (fleet
// and floor) with the server's default fsync interval and with fsync on
// every write (sync_interval: always).
type DurabilityRow struct {
	Lanes   int    `json:"lanes"`
	Default Result `json:"default"`
	Always  Result `json:"always"`
	// RateCost is the fleet's rate with "always" over its rate with the
	// default; P50Cost the ratio of the p50 latencies the other way round
	// (always/default).
	RateCost      float64 `json:"rate_always_over_default"`
	P50Cost       float64 `json:"p50_always_over_default"`
	FloorRateCost float64 `json:"floor_rate_always_over_default"`
}

// Durability runs Compare at each lane count with Sync "default" and
// "always". reuse holds results already measured with the default policy
// (by lane count; with their floors), which are not measured again.
func Durability(ctx context.Context, opts Options, lanes []int, reuse map[int]Result) ([]DurabilityRow, error) {
	var out []DurabilityRow
	for _, n := range lanes {
		o := opts
		o.Lanes = n
		def, ok := reuse[n]
		if !ok || def.Floor == nil {
			o.Sync = "default"
			r, err := Compare(ctx, o)
			if err != nil {
				return out, err
			}
			def = r
		}
		o.Sync = "always"
		alw, err := Compare(ctx, o)
		if err != nil {
			return out, err
		}
		row := DurabilityRow{Lanes: n, Default: def, Always: alw}
		if def.Rate > 0 {
			row.RateCost = alw.Rate / def.Rate
		}
		if def.P50 > 0 {
			row.P50Cost = float64(alw.P50) / float64(def.P50)
		}
		if def.Floor != nil && alw.Floor != nil && def.Floor.Rate > 0 {
			row.FloorRateCost = alw.Floor.Rate / def.Floor.Rate
		}
		out = append(out, row)
	}
	return out, nil
}
