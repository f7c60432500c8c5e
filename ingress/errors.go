package ingress

import (
	"errors"
	"fmt"
	"net/http"
)

var (
	// ErrInvalidConfig reports a Config or constructor argument that New or
	// NewDelivery cannot work with; the error names the field.
	ErrInvalidConfig = errors.New("invalid ingress config")
	// ErrAlreadyStarted is returned by Delivery.Start on a running Delivery.
	ErrAlreadyStarted = errors.New("delivery already started")
)

// apiError is an error answered to an HTTP client: a status and a message
// meant for the client, rendered as {"error": msg}.
type apiError struct {
	status int
	msg    string
	// header holds extra response headers (Allow, WWW-Authenticate, Retry-After).
	header http.Header
	// err is the underlying cause, logged but never shown to the client.
	err error
}

func (e *apiError) Error() string {
	if e.err != nil {
		return fmt.Sprintf("%d %s: %v", e.status, e.msg, e.err)
	}
	return fmt.Sprintf("%d %s", e.status, e.msg)
}

func (e *apiError) Unwrap() error { return e.err }

func errorf(status int, format string, args ...any) *apiError {
	return &apiError{status: status, msg: fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, format, args...)
}

// unavailable is a 503 with Retry-After: the request may succeed when
// retried (NATS is unreachable or slow). cause is logged, not shown.
func unavailable(msg string, cause error) *apiError {
	return &apiError{
		status: http.StatusServiceUnavailable,
		msg:    msg,
		header: http.Header{"Retry-After": {"1"}},
		err:    cause,
	}
}
