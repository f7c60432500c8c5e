package transcript

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// TestLoad_LostFirstPull: the first pull request of a Load's ordered
// consumer never reaches the consumer (on a cluster, a pull sent right after
// the consumer was created on another server can be lost that way; here the
// reader may not publish to that one consumer's pull subject). The missing
// heartbeats must recreate the consumer within the ReadTimeout, so the Load
// still returns every entry. (With nats.go's default heartbeat for an
// ordered consumer, 5s, the Load ran into its 5s ReadTimeout: "read after
// seq 0 of N: context deadline exceeded".)
func TestLoad_LostFirstPull(t *testing.T) {
	t.Parallel()
	names := broker.MustNames("fleet")
	const prefix = "lostpull"
	firstPull := "$JS.API.CONSUMER.MSG.NEXT." + names.TranscriptStream() + "." + prefix + "_1"
	srv := natstest.RunServer(t, natstest.WithServerOptions(func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "admin", Password: "a"},
			{Username: "reader", Password: "r", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{firstPull}},
			}},
		}
	}))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	admin := srv.Connect(t, nats.UserInfo("admin", "a"))
	ajs := natstest.JetStream(t, admin)
	if _, err := broker.Provision(ctx, ajs, broker.ProvisionConfig{Names: names}); err != nil {
		t.Fatal(err)
	}
	w, err := New(ajs, names, nil)
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for _, c := range []string{"one", "two", "three"} {
		if last, err = w.Append(ctx, "s1", last, &Entry{Kind: KindMessage, Role: RoleUser, Content: c}); err != nil {
			t.Fatal(err)
		}
	}

	reader := srv.Connect(t, nats.UserInfo("reader", "r"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	r, err := New(natstest.JetStream(t, reader), names, nil) // ReadTimeout 5s
	if err != nil {
		t.Fatal(err)
	}
	r.namePrefix = func() string { return prefix }
	entries, got, err := r.Load(ctx, "s1")
	if err != nil {
		t.Fatalf("load with its first pull lost: %v", err)
	}
	if got != last || len(entries) != 3 || entries[0].Content != "one" || entries[2].Content != "three" {
		t.Fatalf("load: %d entries up to %d (%+v), want 3 up to %d", len(entries), got, entries, last)
	}
}
