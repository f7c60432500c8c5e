// Package agentfleet is the Go API of agentfleet, the session runtime
// between chat platforms and LLM agents on NATS JetStream.
//
// Backends is the registry of agent backends by name: the agentfleet
// command builds its backend through DefaultBackends, and a program may
// add its own before it does the same.
package agentfleet
