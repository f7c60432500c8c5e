package broker

import "time"

// Defaults of the lane lease, shared by the configuration, the worker and
// provisioning (the workers consumer's AckWait is at least the TTL). They
// are kept here, the lowest package that needs them, and nowhere else.
const (
	// DefaultLeaseTTL is the lane lease TTL, judged by the server.
	DefaultLeaseTTL = 15 * time.Second
	// DefaultLeaseMargin is how long before its lease could expire an
	// owner stops writing.
	DefaultLeaseMargin = 2 * time.Second
)
