package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// APIPrefix is the JetStream API subject prefix of js's options (a custom
// prefix, a domain's, or the default), ending with a dot.
func APIPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	default:
		return jetstream.DefaultAPIPrefix
	}
}

// LeaderGetRequest selects the message LeaderGet reads: the one at Seq,
// the last on LastBySubject, or the first on NextBySubject at or after Seq.
type LeaderGetRequest struct {
	Seq           uint64 `json:"seq,omitempty"`
	LastBySubject string `json:"last_by_subj,omitempty"`
	NextBySubject string `json:"next_by_subj,omitempty"`
}

// LeaderMsg is a message as the stream leader returns it; Header is the
// encoded header block (nats.DecodeHeadersMsg reads it).
type LeaderMsg struct {
	Subject  string `json:"subject"`
	Sequence uint64 `json:"seq"`
	Header   []byte `json:"hdrs,omitempty"`
	Data     []byte `json:"data,omitempty"`
}

// LeaderGet reads one message of stream from the stream leader
// (STREAM.MSG.GET), or returns jetstream.ErrMsgNotFound. A direct get may
// be answered by any replica, and one that lags (just back from a
// partition) does not hold the latest messages: reads that a decision
// rests on (a takeover, the order of replies) must not take its "none".
func LeaderGet(ctx context.Context, js jetstream.JetStream, stream string, req LeaderGetRequest) (*LeaderMsg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	reply, err := js.Conn().RequestWithContext(ctx, APIPrefix(js.Options())+"STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error,omitempty"`
		Message *LeaderMsg          `json:"message,omitempty"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, fmt.Errorf("leader read: decode the reply: %w", err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, resp.Error
	}
	if resp.Message == nil {
		return nil, fmt.Errorf("leader read: empty response")
	}
	return resp.Message, nil
}
