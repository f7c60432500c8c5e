// Package natstest runs real, in-process NATS servers with JetStream for tests.
//
// Every server listens on 127.0.0.1 (a random port unless [WithPort] is given), so
// code under test, the nats CLI and other processes can all reach it over TCP.
// JetStream data goes to a t.TempDir() unless [WithStoreDir] is given. Everything a
// helper creates is torn down through t.Cleanup: connections are closed before the
// servers they talk to are shut down, and shutdown waits for the server's goroutines.
//
// A single server:
//
//	s := natstest.RunServer(t)
//	nc := s.Connect(t)
//	js := natstest.JetStream(t, nc)
//	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "sessions"})
//	...
//	s.Restart(t) // same port, same store dir; nc reconnects by itself
//
// A three-node cluster, ready for replicated streams as soon as RunCluster returns
// (every node accepts connections, a JetStream meta leader is elected and every
// node follows it):
//
//	c := natstest.RunCluster(t, 3)
//	nc := c.Connect(t)
//	js := natstest.JetStream(t, nc)
//	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Replicas: 3})
//	...
//	i := c.StreamLeader(t, "$G", "EVENTS")
//	c.StopNode(t, i)    // fail over
//	c.RestartNode(t, i) // same ports, same data
//
// Never sleep to wait for a state; poll it with [WaitFor]:
//
//	natstest.WaitFor(t, 5*time.Second, "3 messages in EVENTS", func() error {
//		ctx, cancel := context.WithTimeout(ctx, time.Second) // bound each attempt
//		defer cancel()
//		info, err := stream.Info(ctx)
//		if err != nil {
//			return err
//		}
//		if info.State.Msgs != 3 {
//			return fmt.Errorf("have %d messages", info.State.Msgs)
//		}
//		return nil
//	})
//
// Set NATSTEST_LOG=1 (or debug, or trace) to send the servers' logs to stderr.
//
// The helpers call t.Fatal, so call them from the test's own goroutine. A Server or
// Cluster is not safe for concurrent use while it is being stopped or restarted.
package natstest
