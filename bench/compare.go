package bench

import "context"

// Compare measures the floor, then the fleet, with the same options, and
// returns the fleet's result with the floor attached and the fleet/floor
// ratios set. The two never run at the same time: each has its own server,
// which is stopped and removed before the next one starts.
func Compare(ctx context.Context, opts Options) (Result, error) {
	floor, err := Floor(ctx, opts)
	if err != nil {
		return Result{}, err
	}
	fleet, err := Throughput(ctx, opts)
	if err != nil {
		return Result{}, err
	}
	return fleet.WithFloor(floor), nil
}
