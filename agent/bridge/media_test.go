package bridge_test

import (
	"context"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/agent/agenttest"
	"github.com/agentfleet/agentfleet/agent/bridge"
	"github.com/agentfleet/agentfleet/session"
)

// TestMediaRoundTrip: a turn's attachments, quotes and message ids reach
// an agent behind the bridge (served by bridge.Handler) unchanged, in the
// messages, the history and the turn's quote.
func TestMediaRoundTrip(t *testing.T) {
	t.Parallel()
	seen := make(chan *agent.Turn, 1)
	remote := agent.AgentFunc(func(ctx context.Context, t *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
		seen <- t
		return &agent.Result{Text: "ok"}, nil
	})
	srv := httptest.NewServer(bridge.Handler(remote, nil))
	t.Cleanup(srv.Close)
	b := newBackend(t, srv.URL)
	a, _ := b.NewAgent(t.Context(), "k", "s")

	turn := agenttest.NewTurn("agent:main:telegram:dm:1", "look")
	atts := []session.Attachment{{Kind: session.AttachPhoto, FileID: "AgAC", URL: "https://ingress.example/v1/media/telegram/AgAC?sig=00",
		MimeType: "image/jpeg", Size: 84211, Caption: "look"}, {Kind: session.AttachVoice, FileID: "AwAC", URL: "https://ingress.example/v"}}
	q := &session.Quote{MessageID: "41", Text: "earlier", SenderID: "777", SenderName: "fleetbot"}
	turn.Messages[0].MessageID, turn.Messages[0].Attachments, turn.Messages[0].Quote = "42", atts, q
	turn.History[2].Attachments, turn.History[2].Quote = atts, q
	turn.Quote = q
	if _, err := a.Run(t.Context(), turn, &agenttest.Recorder{}); err != nil {
		t.Fatal(err)
	}
	got := <-seen
	if !reflect.DeepEqual(got.Messages, turn.Messages) {
		t.Errorf("messages %+v, want %+v", got.Messages, turn.Messages)
	}
	if !reflect.DeepEqual(got.History[2].Attachments, atts) || !reflect.DeepEqual(got.History[2].Quote, q) {
		t.Errorf("history media %+v %+v", got.History[2].Attachments, got.History[2].Quote)
	}
	if got.Quote == nil || *got.Quote != *q {
		t.Errorf("turn quote %+v", got.Quote)
	}
}
