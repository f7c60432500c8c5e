package statedb_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentfleet/agentfleet/statedb"
)

func Example() {
	dir, _ := os.MkdirTemp("", "statedb-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	db, err := statedb.Open(ctx, filepath.Join(dir, "state.db"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	_ = db.CreateSession(ctx, statedb.NewSession{ID: "s1", Source: "cli", Title: "Fix Docker Build", StartedAt: at})
	_, _ = db.AppendMessage(ctx, statedb.NewMessage{SessionID: "s1", Role: "user", Content: "the chat-send job fails", Timestamp: at})
	_, _ = db.AppendMessage(ctx, statedb.NewMessage{SessionID: "s1", Role: "assistant", Content: "rebuild the image", Timestamp: at.Add(time.Second)})

	res, _ := db.SearchMessages(ctx, "chat-send", statedb.SearchOptions{})
	fmt.Println(res[0].Snippet)
	fmt.Println(res[0].Context[0].Content)
	next, _ := db.GetNextTitleInLineage(ctx, "Fix Docker Build")
	fmt.Println(next)
	// Output:
	// the >>>chat-send<<< job fails
	// rebuild the image
	// Fix Docker Build #2
}
