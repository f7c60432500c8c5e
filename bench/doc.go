// Package bench measures agentfleet against the raw JetStream floor, and
// its recovery and scale: it is the library behind `agentfleet bench`.
//
// Scenarios, each on its own embedded server in a temporary directory:
//
//   - [Floor] performs, with no agentfleet code in between, the JetStream
//     operations one turn costs: an inbound publish with a Msg-Id, its
//     delivery from a durable pull consumer shared by all lanes, a KV get and
//     a KV CAS (the intent), the user and assistant transcript appends
//     (expect-last-subject-seq), the outbound publish with a Msg-Id, the
//     turn-end append, a KV CAS (the commit) and the ack — in the order
//     worker/turn.go issues them, with payloads of the same types and sizes.
//   - [Throughput] runs the real fleet: N worker loops (or processes) with the
//     echo agent, the HTTP ingress adapter on a loopback listener, and
//     optionally the HTTP delivery consumer. With Options.Ingress set to
//     IngressAdapter the messages go to the ingress in process instead
//     (ingress.Publisher.Publish, the platform adapters' path: no HTTP hop).
//     With Options.NATSURL and Options.IngressURL it measures a running
//     fleet instead.
//   - [Compare] runs both and fills the fleet/floor ratios; [Durability] runs
//     Compare with the server's default fsync interval and with "always".
//   - [Takeover] kill -9s worker processes running long turns and times the
//     kill to the resumed turn's first progress (its turn event).
//   - [Handover] restarts every worker process in turn under load, compares
//     the latency of the handed-over turns with the rest, and checks that no
//     message was lost or duplicated (transcripts and outbox).
//   - [Scale] fills the session store in bulk (1k to 1M entries) and measures
//     per-turn latency and worker memory, and optionally one expiry sweep.
//
// In the throughput scenarios every lane keeps exactly one message in flight
// (closed loop): it sends a message, waits for the reply, and sends the next.
// A core subscription on the outbox (or on the mailboxes) timestamps each
// reply on arrival, so the measurement neither polls nor sleeps. Latency is
// taken from acceptance (the 202 of the POST, or the PubAck of the floor's
// inbound publish) to the reply's arrival; the send-to-reply round trip is
// reported beside it.
//
// [Report] gathers the results of a run, evaluates the goals, and
// renders them as text, JSON, or the generated sections of
// docs/benchmarks.md ([UpdateMarkdown]); [WriteSVG] draws the latency chart.
// Worker processes are the agentfleet binary (Options.WorkerBinary) run as
// `worker --id ...` against the embedded server's client listener. The go
// test entry point is BenchmarkTurns in bench_test.go.
package bench
