package transcript_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/transcript"
)

// Example shows a lane owner fencing a transcript, running a turn, and a
// former owner being refused.
func Example() {
	dir, _ := os.MkdirTemp("", "transcript-example")
	defer os.RemoveAll(dir)
	s, _ := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	s.Start()
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	if !s.ReadyForConnections(10 * time.Second) {
		panic("server not ready")
	}
	nc, _ := nats.Connect(s.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	names := broker.MustNames("fleet")
	if _, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: names}); err != nil {
		panic(err)
	}

	log, _ := transcript.New(js, names, nil)
	const session = "20260101_120000_abcdef01"

	// Worker A takes the lease (epoch 1), fences, runs a turn.
	_, last, _ := log.Load(ctx, session)
	last, _ = log.Append(ctx, session, last, &transcript.Entry{Kind: transcript.KindFence, Epoch: 1, Owner: "A"})
	last, _ = log.Append(ctx, session, last, &transcript.Entry{Kind: transcript.KindMessage, Role: transcript.RoleUser, Content: "hi"})
	aLast := last

	// Worker B takes over (epoch 2) and fences.
	_, last, _ = log.Load(ctx, session)
	fence, _ := log.Append(ctx, session, last, &transcript.Entry{Kind: transcript.KindFence, Epoch: 2, Owner: "B"})

	// A, paused meanwhile, tries to write its reply.
	_, err := log.Append(ctx, session, aLast, &transcript.Entry{Kind: transcript.KindMessage, Role: transcript.RoleAssistant, Content: "late"})
	var ce *transcript.ConflictError
	fmt.Println("zombie refused:", errors.As(err, &ce) && ce.Actual == fence)

	entries, _, _ := log.Load(ctx, session)
	fmt.Println("entries:", len(entries), "fence epoch:", transcript.FenceEpoch(entries))
	// Output:
	// zombie refused: true
	// entries: 3 fence epoch: 2
}

// ExampleRewindUserTurns shows /undo: the last user turn is soft-deleted by a
// control entry, and Effective no longer shows it.
func ExampleRewindUserTurns() {
	entries := []transcript.Entry{
		{Seq: 1, Kind: transcript.KindMessage, Role: transcript.RoleUser, Content: "first question"},
		{Seq: 2, Kind: transcript.KindMessage, Role: transcript.RoleAssistant, Content: "first answer"},
		{Seq: 3, Kind: transcript.KindMessage, Role: transcript.RoleUser, Content: "second question"},
		{Seq: 4, Kind: transcript.KindMessage, Role: transcript.RoleAssistant, Content: "second answer"},
		{Seq: 5, Kind: transcript.KindTurnEnd, TurnID: "t2", Status: transcript.StatusCompleted},
	}
	ctl, turns, text := transcript.RewindUserTurns(entries, 1)
	fmt.Println(ctl.Kind, ctl.Rewound, turns, text)

	ctl.Seq = 6 // as if appended
	for _, e := range transcript.Effective(append(entries, *ctl)) {
		fmt.Println(e.Role+":", e.Content)
	}
	// Output:
	// rewind [3 4] 1 second question
	// user: first question
	// assistant: first answer
}
