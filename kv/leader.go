package kv

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
)

// leaderLast reads the last message of a key of bucket from the stream
// leader (broker.LeaderGet), not by a direct get that any replica, one that
// lags included, may answer. A key that is absent, deleted, purged or
// expired gives ErrNotFound.
func leaderLast(ctx context.Context, js jetstream.JetStream, bucket, key string) (seq uint64, data []byte, err error) {
	m, err := broker.LeaderGet(ctx, js, "KV_"+bucket, broker.LeaderGetRequest{LastBySubject: "$KV." + bucket + "." + key})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil, ErrNotFound
	}
	if err != nil {
		return 0, nil, err
	}
	if len(m.Header) > 0 {
		if h, err := nats.DecodeHeadersMsg(m.Header); err == nil {
			if op := h.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
				return 0, nil, ErrNotFound
			}
			if h.Get("Nats-Marker-Reason") != "" {
				return 0, nil, ErrNotFound
			}
		}
	}
	return m.Sequence, m.Data, nil
}
