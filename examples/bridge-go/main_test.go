package main

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent/agenttest"
	"github.com/agentfleet/agentfleet/agent/bridge"
)

// The example answers through the bridge backend as the worker would call it.
func TestShouterOverTheBridge(t *testing.T) {
	srv := httptest.NewServer(bridge.Handler(shouter{now: func() time.Time { return time.Date(2026, 1, 1, 15, 4, 0, 0, time.UTC) }}, nil))
	defer srv.Close()
	b, err := bridge.New(bridge.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a, _ := b.NewAgent(t.Context(), "k", "s")
	rec := &agenttest.Recorder{}
	res, err := a.Run(t.Context(), agenttest.NewTurn("agent:main:http:dm:c1", "what is the time please"), rec)
	if err != nil || res.Text != "WHAT IS THE TIME PLEASE" {
		t.Fatalf("Run: %+v %v", res, err)
	}
	ev := rec.Events()
	if len(ev) < 2 || ev[0].Kind != "tool_call" || ev[1].Kind != "tool_result" || ev[1].Content != "3:04PM" {
		t.Errorf("events %+v, want the clock call and its result first", ev)
	}
	if rec.Streamed() != res.Text {
		t.Errorf("streamed %q", rec.Streamed())
	}
}
