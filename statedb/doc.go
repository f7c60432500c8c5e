// Package statedb is agentfleet's state database: one SQLite file (pure Go,
// modernc.org/sqlite, WAL mode) holding every session and message of a
// fleet, searchable, for people and tools rather than for the workers.
//
// The schema is the session-storage schema at version 11: tables sessions,
// messages, messages_fts and messages_fts_trigram (FTS5 over content, tool
// name and tool calls; the second with the trigram tokenizer for CJK and
// substring search), state_meta and schema_version. Open creates the file
// or migrates an older one (declarative column reconcile, then the
// version-gated steps).
//
// Writes run in BEGIN IMMEDIATE transactions with a one-second busy timeout
// and an application retry with random 20–150 ms pauses (up to 15 times),
// and every 50 writes end with a passive WAL checkpoint, so several
// processes can write one file. A file opened with Options.ReadOnly serves
// reads while another process writes.
//
//	db, err := statedb.Open(ctx, "state.db", nil)
//	err = db.CreateSession(ctx, statedb.NewSession{ID: "s1", Source: "cli"})
//	_, err = db.AppendMessage(ctx, statedb.NewMessage{SessionID: "s1", Role: "user", Content: "deploy chat-send"})
//	res, err := db.SearchMessages(ctx, "chat-send", statedb.SearchOptions{}) // snippets marked >>>match<<<
//
// The Indexer fills a DB from the fleet's streams (transcripts and lifecycle
// events) in batched transactions that also record how far it got, so it
// resumes exactly after a crash; API serves a DB as the NATS micro service
// <prefix>_api (search, sessions, session, transcript, stats, export).
package statedb
