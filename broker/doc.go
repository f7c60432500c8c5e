// Package broker is agentfleet's NATS layer: the fleet's names (subjects,
// streams, buckets and consumers under one prefix, names.go), the
// connection (connect.go), the provisioning of the streams, buckets and the
// workers consumer (provision.go), an embedded nats-server for a single
// node or a test (server.go), and the header names every component shares.
//
// Defaults that more than one package needs, such as the lane lease TTL,
// live here (defaults.go), the lowest package that needs them.
package broker
