package config

import "fmt"

// FieldError is one refused configuration value. Load, Set and Validate
// return them (several joined with errors.Join); match with errors.As.
type FieldError struct {
	// Field is the YAML path of the key, e.g. "lease.ttl".
	Field string
	// Value is the refused value as text ("" for an unknown key).
	Value string
	// Reason says what is wrong; it quotes the value, e.g.
	// `"1s" is below the minimum of 3s`.
	Reason string
	// Source says where the value came from when known: an environment
	// variable (AGENTFLEET_LEASE_TTL) or a file and line (fleet.yaml:12).
	Source string
}

// Error formats the error as
//
//	config: lease.ttl: "1s" is below the minimum of 3s (from AGENTFLEET_LEASE_TTL)
func (e *FieldError) Error() string {
	s := fmt.Sprintf("config: %s: %s", e.Field, e.Reason)
	if e.Field == "" {
		s = "config: " + e.Reason
	}
	if e.Source != "" {
		s += " (from " + e.Source + ")"
	}
	return s
}
