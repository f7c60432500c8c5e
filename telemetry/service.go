package telemetry

import (
	"encoding/json"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// ServiceConfig describes a fleet process's NATS micro service.
type ServiceConfig struct {
	// Name is the service name (broker.Names.ServiceName).
	Name string
	// Version is the process's version (semantic versioning).
	Version     string
	Description string
	// Metadata is shown by INFO (role, worker id, host...).
	Metadata map[string]string
	// Subject is the status endpoint's subject
	// (broker.Names.ServiceStatusSubject).
	Subject string
	// Status returns the process's own status: the status endpoint's
	// answer and the endpoint's data in STATS.
	Status func() any
}

// AddService registers the micro service of cfg on nc, so that `nats micro
// ls`, `info`, `stats` and `ping` list the process. Stop the returned
// service when the process stops.
func AddService(nc *nats.Conn, cfg ServiceConfig) (micro.Service, error) {
	if cfg.Status == nil {
		return nil, errors.New("telemetry: service status is required")
	}
	return micro.AddService(nc, micro.Config{
		Name: cfg.Name, Version: cfg.Version, Description: cfg.Description, Metadata: cfg.Metadata,
		Endpoint: &micro.EndpointConfig{Subject: cfg.Subject, Handler: micro.HandlerFunc(func(r micro.Request) {
			data, err := json.Marshal(cfg.Status())
			if err != nil {
				_ = r.Error("500", err.Error(), nil)
				return
			}
			_ = r.Respond(data)
		}), Metadata: map[string]string{"format": "application/json"}},
		StatsHandler: func(*micro.Endpoint) any { return cfg.Status() },
	})
}
