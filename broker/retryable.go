package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream error codes provisioning treats specially (nats-server's
// errors.json).
const (
	jsErrClusterNoPeers          jetstream.ErrorCode = 10005 // no suitable peers: nodes still joining
	jsErrClusterNotLeader        jetstream.ErrorCode = 10009
	jsErrStreamReplicasNotSupp   jetstream.ErrorCode = 10074 // replicas > 1 on a server that is not clustered
	jsErrStreamOffline           jetstream.ErrorCode = 10118
	jsErrConsumerOffline         jetstream.ErrorCode = 10119
	jsErrStreamOfflineReason     jetstream.ErrorCode = 10194
	jsErrConsumerOfflineReason   jetstream.ErrorCode = 10195
	jsErrClusterMemberChangeBusy jetstream.ErrorCode = 10202
)

// permanentError marks an error of this package that no retry can fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

func permanent(err error) error { return &permanentError{err: err} }

// ErrReplicasNeedCluster is matched (errors.Is) by a provisioning error
// caused by a replica count above 1 on a NATS server that is not part of a
// cluster: the fix is nats.replicas 1 or a cluster, not a retry.
var ErrReplicasNeedCluster = errors.New("replicas above 1 need a clustered NATS (JetStream reports: replicas > 1 not supported in non-clustered mode)")

// Retryable reports whether a failed Provision may succeed if tried again
// later: JetStream is not ready yet (a cluster electing its meta leader,
// nodes still joining, a timeout, a 503). A refusal that no retry can fix,
// such as replicas above 1 on a server that is not clustered, an invalid or
// conflicting configuration, or a consumer whose settings break the lane
// protocol, is not.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	var pe *permanentError
	if errors.As(err, &pe) {
		return false
	}
	var api *jetstream.APIError
	if !errors.As(err, &api) {
		// Timeouts, no responders, a connection closed or reconnecting.
		return true
	}
	return retryableAPI(api)
}

// retryableAPI reports whether JetStream's refusal api may be gone when
// asked again: no meta or stream leader yet (an election), an asset
// offline, peers still joining, a timeout, a 503.
func retryableAPI(api *jetstream.APIError) bool {
	switch api.ErrorCode {
	case jsErrClusterNoPeers, jsErrClusterNotLeader, jsErrStreamOffline, jsErrConsumerOffline,
		jsErrStreamOfflineReason, jsErrConsumerOfflineReason, jsErrClusterMemberChangeBusy:
		return true
	}
	return api.Code == 503 || api.Code == 429 || api.Code == 408
}

// Transient reports whether a failed JetStream call on a running fleet may
// succeed if made again shortly: the cluster is electing a meta or stream
// leader ("JetStream system temporarily unavailable", not leader, offline),
// the call timed out, no server answered, or the connection is
// reconnecting. Unlike Retryable, an error it does not know is not
// transient: a caller retrying a step of its own must not retry its own
// refusals.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	var pe *permanentError
	if errors.As(err, &pe) {
		return false
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return retryableAPI(api)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, jetstream.ErrServerShutdown),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrNoServers):
		return true
	}
	return false
}

// explainProvision makes a provisioning error self-explanatory where the
// server's words are not, and marks the ones no retry can fix.
func explainProvision(err error) error {
	var api *jetstream.APIError
	if errors.As(err, &api) && api.ErrorCode == jsErrStreamReplicasNotSupp {
		return permanent(fmt.Errorf("%w: %w", ErrReplicasNeedCluster, err))
	}
	return err
}

// ProvisionRetry runs Provision, and while it fails with an error Retryable
// accepts (a cluster still electing its meta leader, nodes still joining)
// tries again with backoff for up to wait, logging each failure. An error no
// retry can fix is returned at once, as is the last error once wait has
// passed.
func ProvisionRetry(ctx context.Context, js jetstream.JetStream, pc ProvisionConfig, wait time.Duration, log *slog.Logger) (*Resources, error) {
	if log == nil {
		log = slog.Default()
	}
	deadline := time.Now().Add(wait)
	return backoff.Retry(ctx, func() (*Resources, error) {
		res, err := Provision(ctx, js, pc)
		if err != nil && !Retryable(err) {
			return nil, backoff.Permanent(err)
		}
		return res, err
	},
		backoff.WithBackOff(&deadlineBackOff{b: newWaitBackOff(), deadline: deadline}),
		backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, next time.Duration) {
			log.Warn("provisioning failed; retrying", slog.String("retry_in", next.Round(time.Millisecond).String()),
				slog.String("gives_up_in", time.Until(deadline).Round(time.Second).String()), slog.Any("error", err))
		}),
	)
}
