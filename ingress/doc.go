// Package ingress is the edge of agentfleet towards chat platforms: the HTTP
// adapter (platform "http") that accepts user messages into the lane inboxes,
// and the delivery consumer that turns the replies of the workers into a
// per-lane mailbox the HTTP adapter serves.
//
// # Accepting a message
//
// POST /v1/messages takes one JSON object,
//
//	{"platform": "http", "chat_id": "c1", "chat_type": "dm", "user_id": "u1",
//	 "message_id": "m1", "text": "hello"}
//
// builds a [session.SessionSource], normalizes and validates it, derives the
// session key, its lane token and partition, classifies the text (plain
// message, /queue item or fleet command) and publishes a [session.Inbound] to
// the lane's inbox subject <prefix>.in.<partition>.<lane>. The answer, 202
// {"session_key", "seq", "duplicate"}, is given only after JetStream
// acknowledged the message, so a client that sees anything else may safely
// retry: a failed publish answers 503. So does a failed read (or renewal)
// of the message id's msgids record, which runs while the message is
// published: that 503 may come with the message stored, and it then runs,
// once; the client's retry with the same message_id is answered as its
// duplicate.
//
// A message_id makes retries idempotent. The platform message id
// "<platform>:<chat_id>:<message_id>" is the Nats-Msg-Id of the inbox message
// (the stream drops a repeat inside its de-duplication window). The worker
// that incorporates the message records the id in the msgids bucket with the
// inbox sequence that holds it, and the ingress reads that record while it
// publishes (the two round trips at once), which keeps a retry days later a
// duplicate. A duplicate answers 202 with the original sequence and
// "duplicate": true. (A retry beyond the stream's window is stored again,
// whether it comes while the original still waits in its lane or after it
// was incorporated; the worker finds its id taken and does not run it.)
//
// Bad input gets a 4xx with {"error": "..."} and publishes nothing: malformed
// JSON, unknown fields, a missing or blank text, a /queue without text, a
// missing chat_id, an unknown platform or chat type, a platform other than
// "http" (its messages come through its own adapter, and its replies would
// never reach these mailboxes), identifiers that could escape a path or a
// subject (400), a body over Config.MaxBodyBytes or a message larger than the
// server's payload limit once enveloped (413), a missing or wrong bearer
// token when Config.Token is set (401).
//
// # Reading replies
//
// Replies reach the HTTP platform through [Delivery]: a durable consumer on
// the outbox stream that copies each reply of platform "http", once and in
// order, into the lane's mailbox subject <prefix>.box.http.<lane>. The server
// reads that mailbox:
//
//	GET /v1/sessions/{session_key}                          the SessionEntry
//	GET /v1/sessions/{session_key}/replies?after=N&wait=30s  replies after seq N (long poll)
//	GET /v1/sessions/{session_key}/events?after=N            the same, as server-sent events
//
// A reply's seq is its sequence in the outbox stream: a client passes the
// last seq it has seen as after (or as Last-Event-ID) and never misses or
// repeats one. Readers hold no consumer: one subscription per process to
// the mailbox hints (<prefix>.boxhint.http.<lane>, republished by the
// server once a mailbox message is stored) wakes them, and they read by
// direct get. A client (bearer token, else IP address) may hold at most
// Config.MaxReadersPerClient readers open; one more is answered 429.
//
// # Wiring
//
//	res, err := broker.Provision(ctx, js, broker.ProvisionConfig{Names: names})
//	srv, err := ingress.New(js, res, ingress.Config{Names: names, KeyOptions: session.DefaultKeyOptions()})
//	d := ingress.NewDelivery(js, res, names, logger)
//	if err := d.Start(ctx); err != nil { ... }
//	defer d.Stop()
//	hs := &http.Server{Addr: ":8080", Handler: srv.Handler()}
//	hs.RegisterOnShutdown(srv.Close) // end long polls and event streams
//
// GET /healthz answers while the process runs; GET /readyz answers 200 while
// the NATS connection is up and the function given to [Server.SetReady]
// returns nil.
package ingress
