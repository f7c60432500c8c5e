package telemetry

import (
	"encoding/json"
	"errors"
	"maps"
	"regexp"
	"strings"

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
	version, md := ServiceVersion(cfg.Version), cfg.Metadata
	if version != cfg.Version {
		// The build's own version string (a commit id from git describe,
		// say) is kept beside the semantic version the service API needs.
		md = maps.Clone(md)
		if md == nil {
			md = map[string]string{}
		}
		md["build"] = cfg.Version
	}
	return micro.AddService(nc, micro.Config{
		Name: cfg.Name, Version: version, Description: cfg.Description, Metadata: md,
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

// semVer is the semantic versioning 2.0 grammar the micro service API
// checks versions against.
var semVer = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// ServiceVersion returns v when it is a semantic version, else a
// pre-release of 0.0.0 named after it ("b162c58-dirty" becomes
// "0.0.0-b162c58-dirty"), so that a binary built with any version string
// still registers its service.
func ServiceVersion(v string) string {
	if semVer.MatchString(v) {
		return v
	}
	id := strings.Map(func(r rune) rune {
		switch {
		case r >= '0' && r <= '9', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r == '-':
			return r
		}
		return '-'
	}, v)
	if id == "" {
		id = "dev"
	}
	// A numeric identifier must not start with 0; a leading letter keeps
	// it alphanumeric.
	return "0.0.0-v" + id
}
