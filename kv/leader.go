package kv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errEmptyLeaderReply is a leader read answered with neither a message nor
// an error.
var errEmptyLeaderReply = errors.New("empty response")

// leaderLast reads the last message of a key of bucket from the stream
// leader (STREAM.MSG.GET), not by a direct get that any replica, one that
// lags included, may answer. A key that is absent, deleted, purged or
// expired gives ErrNotFound.
func leaderLast(ctx context.Context, js jetstream.JetStream, bucket, key string) (seq uint64, data []byte, err error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": "$KV." + bucket + "." + key})
	reply, err := js.Conn().RequestWithContext(ctx, apiPrefix(js.Options())+"STREAM.MSG.GET.KV_"+bucket, req)
	if err != nil {
		return 0, nil, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error,omitempty"`
		Message *struct {
			Seq  uint64 `json:"seq"`
			Hdrs []byte `json:"hdrs,omitempty"`
			Data []byte `json:"data,omitempty"`
		} `json:"message,omitempty"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return 0, nil, fmt.Errorf("decode the reply: %w", err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return 0, nil, ErrNotFound
		}
		return 0, nil, resp.Error
	}
	if resp.Message == nil {
		return 0, nil, errEmptyLeaderReply
	}
	if len(resp.Message.Hdrs) > 0 {
		if h, err := nats.DecodeHeadersMsg(resp.Message.Hdrs); err == nil {
			if op := h.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
				return 0, nil, ErrNotFound
			}
			if h.Get("Nats-Marker-Reason") != "" {
				return 0, nil, ErrNotFound
			}
		}
	}
	return resp.Message.Seq, resp.Message.Data, nil
}
