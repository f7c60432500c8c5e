package config

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// The checks below depend on the role a process runs, so Validate (which
// every role runs) does not make them: a configuration file shared by the
// whole fleet may well set http.addr for the ingress and nats.replicas for a
// cluster, and a worker must still start with it.

// CheckHTTP refuses an HTTP server reachable from other machines with no
// authentication: http.addr on a non-loopback address (":8080",
// "0.0.0.0:8080", a LAN address or a host name other than localhost) needs
// http.token, unless http.allow_unauthenticated is set. The roles that serve
// HTTP (`agentfleet up`, `agentfleet ingress`) call it. src, from
// LoadSourced, names where the address came from; it may be nil.
func (c Config) CheckHTTP(src Sources) error {
	if c.HTTP.Token != "" || c.HTTP.ScopedTokensFile != "" || c.HTTP.AllowUnauthenticated || IsLoopback(c.HTTP.Addr) {
		return nil
	}
	port := "8080"
	if _, p, err := net.SplitHostPort(c.HTTP.Addr); err == nil && p != "" {
		port = p
	}
	return &FieldError{
		Field: "http.addr",
		Value: c.HTTP.Addr,
		Reason: fmt.Sprintf("%q accepts connections from other machines and http.token is empty: set http.token "+
			"(AGENTFLEET_HTTP_TOKEN), listen on this machine only (%q), or, if something in front of it "+
			"authenticates, set http.allow_unauthenticated (--allow-unauthenticated)", c.HTTP.Addr, net.JoinHostPort("127.0.0.1", port)),
		Source: src.Of("http.addr"),
	}
}

// CheckUp checks what `agentfleet up` needs beyond Validate: its one
// embedded NATS server is not a cluster, so every stream and bucket has one
// copy (nats.replicas must be 1), and CheckHTTP.
func (c Config) CheckUp(src Sources) error {
	var errs []error
	if c.NATS.Replicas != 1 {
		errs = append(errs, &FieldError{
			Field: "nats.replicas",
			Value: strconv.Itoa(c.NATS.Replicas),
			Reason: fmt.Sprintf("%q needs a NATS cluster, but `agentfleet up` runs one embedded server: set nats.replicas to 1, "+
				"or run a cluster (`agentfleet nats --cluster-name ...` on 3 nodes) with separate worker and ingress processes",
				strconv.Itoa(c.NATS.Replicas)),
			Source: src.Of("nats.replicas"),
		})
	}
	if err := c.CheckHTTP(src); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// IsLoopback reports whether the host of a host:port address can only be
// reached from this machine: a loopback IP (127.0.0.0/8, ::1) or
// "localhost". An empty host (":8080") listens on every interface.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
