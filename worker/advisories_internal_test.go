package worker

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/broker"
)

// TestAdvisoriesRefused: the subscriptions to the inbox advisories of a user
// whose permissions refuse them are found refused (the worker then reads the
// streams' identities every inboxCheckPoll); the worker role's are not.
func TestAdvisoriesRefused(t *testing.T) {
	t.Parallel()
	var users []broker.ServerUser
	for _, role := range []string{broker.RoleWorker, broker.RoleHealthcheck} {
		users = append(users, broker.ServerUser{User: role, Password: role + "-pw", Role: role})
	}
	srv, err := broker.StartServer(broker.ServerConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	subjects := broker.MustNames(broker.DefaultPrefix).InboxAdvisories()
	for _, c := range []struct {
		role    string
		refused bool
	}{{broker.RoleWorker, false}, {broker.RoleHealthcheck, true}} {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(c.role, c.role+"-pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		ch := make(chan *nats.Msg, 1)
		for _, s := range subjects {
			if _, err := nc.ChanSubscribe(s, ch); err != nil {
				t.Fatal(err)
			}
		}
		err = advisoriesRefused(nc, subjects)
		if (err != nil) != c.refused {
			t.Errorf("%s: refused %v, want refused %t", c.role, err, c.refused)
		}
		nc.Close()
	}
}
