package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// SubjectPending counts the messages of stream stored on subject (a
// literal subject or a filter) whose sequence is at least from. The stream
// must allow direct gets.
//
// It is one batch direct get of a single message: the server counts the
// matching messages from its subject index (no message is read but the
// first) and says how many follow the one it returns in its
// Nats-Num-Pending header. A request that matches nothing is a 404: zero.
// The end-of-batch message that follows the first is left to the
// connection's response handler, which drops it.
func SubjectPending(ctx context.Context, js jetstream.JetStream, stream, subject string, from uint64) (uint64, error) {
	if from == 0 {
		from = 1
	}
	req, err := json.Marshal(struct {
		Seq     uint64 `json:"seq"`
		NextFor string `json:"next_by_subj"`
		Batch   int    `json:"batch"`
	}{from, subject, 1})
	if err != nil {
		return 0, err
	}
	prefix := js.Options().APIPrefix
	if prefix == "" {
		prefix = jetstream.DefaultAPIPrefix
	}
	if !strings.HasSuffix(prefix, ".") {
		prefix += "."
	}
	msg, err := js.Conn().RequestWithContext(ctx, prefix+"DIRECT.GET."+stream, req)
	if err != nil {
		return 0, fmt.Errorf("count %s from seq %d in %s: %w", subject, from, stream, err)
	}
	switch status := msg.Header.Get("Status"); status {
	case "":
	case "404":
		return 0, nil
	default:
		return 0, fmt.Errorf("count %s from seq %d in %s: status %s %s", subject, from, stream, status, msg.Header.Get("Description"))
	}
	after, err := strconv.ParseUint(msg.Header.Get("Nats-Num-Pending"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("count %s from seq %d in %s: Nats-Num-Pending %q: %w", subject, from, stream, msg.Header.Get("Nats-Num-Pending"), err)
	}
	return after + 1, nil
}
