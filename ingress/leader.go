package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// leaderMsg is a message read from the stream leader.
type leaderMsg struct {
	Sequence uint64
	Data     []byte
}

// leaderNext returns the first message of stream on subject at or after
// seq, read from the stream leader (STREAM.MSG.GET), or
// jetstream.ErrMsgNotFound. A direct get may be answered by any replica,
// and one that lags (just back from a partition) does not hold the latest
// messages: "none" from it is not an answer the delivery's ordering may
// rest on.
func leaderNext(ctx context.Context, js jetstream.JetStream, stream, subject string, seq uint64) (*leaderMsg, error) {
	req, _ := json.Marshal(struct {
		Seq  uint64 `json:"seq"`
		Next string `json:"next_by_subj"`
	}{seq, subject})
	reply, err := js.Conn().RequestWithContext(ctx, apiPrefix(js.Options())+"STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error,omitempty"`
		Message *struct {
			Seq  uint64 `json:"seq"`
			Data []byte `json:"data,omitempty"`
		} `json:"message,omitempty"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, err
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, resp.Error
	}
	if resp.Message == nil {
		return nil, errors.New("leader read: empty response")
	}
	return &leaderMsg{Sequence: resp.Message.Seq, Data: resp.Message.Data}, nil
}

func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	default:
		return jetstream.DefaultAPIPrefix
	}
}
