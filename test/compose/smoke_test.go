//go:build compose

package compose

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/worker"
)

// smoke checks the stack as a user meets it: every stream and bucket is
// replicated on the three nodes, a message posted to either ingress gets
// its reply (read through both), and fleetctl on the host lists the three
// workers. The NATS nodes enforce their users: a client without
// credentials is refused by each, and a role's user is refused what its
// permissions leave out.
func smoke(t *testing.T, s *stack) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Every node refuses a client without credentials, and one with a
	// wrong password.
	for _, u := range strings.Split(s.natsURLs, ",") {
		for _, opts := range [][]nats.Option{nil, {nats.UserInfo("admin", "not-the-password")}} {
			nc, err := nats.Connect(u, append(opts, nats.Timeout(10*time.Second), nats.NoReconnect())...)
			if err == nil {
				nc.Close()
				t.Fatalf("%s admitted a client without valid credentials", u)
			}
			if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
				t.Errorf("%s refused a client without valid credentials, but not for authorization: %v", u, err)
			}
		}
	}
	// The worker's user is in, with its permissions only: deleting a
	// stream (an admin's right) is refused.
	wc, err := nats.Connect(s.natsURLs, nats.UserInfo("worker", workerPassword), nats.CustomInboxPrefix("_INBOX_worker"),
		nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatalf("the worker user: %v", err)
	}
	defer wc.Close()
	denied := make(chan error, 1)
	wc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(err.Error(), "Permissions Violation") {
			select {
			case denied <- err:
			default:
			}
		}
	})
	if _, err := wc.Request("$JS.API.STREAM.DELETE."+s.res.Inbox.CachedInfo().Config.Name, nil, 10*time.Second); err == nil {
		t.Fatal("the worker user deleted the inbox stream")
	}
	select {
	case err := <-denied:
		t.Logf("worker user refused a stream delete: %v", err)
	case <-time.After(30 * time.Second):
		t.Error("the worker user's stream delete got no permission violation")
	}
	if _, err := s.res.Inbox.Info(ctx); err != nil {
		t.Fatalf("inbox stream after the worker's delete: %v", err)
	}

	// R3 everywhere, with a leader and two current replicas.
	streams := map[string]jetstream.Stream{"inbox": s.res.Inbox, "transcripts": s.res.Transcripts, "outbox": s.res.Outbox, "events": s.res.Events}
	for name, kvb := range map[string]jetstream.KeyValue{"sessions": s.res.Sessions, "leases": s.res.Leases, "msgids": s.res.MsgIDs, "workers": s.res.Workers} {
		st, err := s.js.Stream(ctx, "KV_"+kvb.Bucket())
		if err != nil {
			t.Fatalf("bucket %s: %v", name, err)
		}
		streams["bucket "+name] = st
	}
	for name, st := range streams {
		waitFor(t, time.Minute, name+" replicated on three nodes", func() error {
			info, err := st.Info(ctx)
			if err != nil {
				return err
			}
			if info.Config.Replicas != 3 {
				return fmt.Errorf("%s: %d replicas", info.Config.Name, info.Config.Replicas)
			}
			if info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
				return fmt.Errorf("%s: cluster %+v", info.Config.Name, info.Cluster)
			}
			for _, p := range info.Cluster.Replicas {
				if !p.Current {
					return fmt.Errorf("%s: replica %s not current", info.Config.Name, p.Name)
				}
			}
			return nil
		})
	}

	// A message to each ingress; its reply read through both.
	for i, base := range s.ingress {
		chat := fmt.Sprintf("smoke-%d", i)
		text := fmt.Sprintf("hello through ingress%d", i+1)
		a, err := s.post(ctx, base, chat, text, "smoke-1")
		if err != nil {
			t.Fatal(err)
		}
		for j, rb := range s.ingress {
			var got []reply
			waitFor(t, time.Minute, fmt.Sprintf("the reply to ingress%d's message through ingress%d", i+1, j+1), func() error {
				var err error
				got, err = s.replies(ctx, rb, a.SessionKey, 0, 5*time.Second)
				if err != nil {
					return err
				}
				if len(got) == 0 {
					return fmt.Errorf("no reply yet")
				}
				return nil
			})
			if want := "echo: " + text; len(got) != 1 || got[0].Text != want || got[0].Kind != "reply" {
				t.Errorf("ingress%d's message, read through ingress%d: %+v, want one reply %q", i+1, j+1, got, want)
			}
		}
		// A platform retry of the same message is a duplicate, not a
		// second message.
		b, err := s.post(ctx, s.ingress[1-i], chat, text, "smoke-1")
		if err != nil {
			t.Fatal(err)
		}
		if !b.Duplicate || b.Seq != a.Seq {
			t.Errorf("retry through the other ingress: %+v, want a duplicate of seq %d", b, a.Seq)
		}
	}

	// fleetctl on the host, through a published NATS port.
	bin := filepath.Join(t.TempDir(), "fleetctl")
	build := exec.Command("go", "build", "-o", bin, "github.com/agentfleet/agentfleet/cmd/fleetctl")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build fleetctl: %v\n%s", err, out)
	}
	var listed []string
	waitFor(t, time.Minute, "fleetctl worker ls to list w1, w2, w3 running", func() error {
		cmd := exec.Command(bin, "worker", "ls", "--json")
		cmd.Env = append(s.env, "NATS_URL="+s.natsURLs, "AGENTFLEET_NATS_USER=admin", "AGENTFLEET_NATS_PASSWORD="+adminPassword)
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("fleetctl worker ls: %v %s", err, out)
		}
		var doc struct {
			Workers []worker.WorkerRecord `json:"workers"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			return fmt.Errorf("fleetctl worker ls --json: %v: %s", err, out)
		}
		listed = listed[:0]
		for _, r := range doc.Workers {
			if r.State == worker.StateRunning {
				listed = append(listed, r.ID)
			}
		}
		slices.Sort(listed)
		if !slices.Equal(listed, []string{"w1", "w2", "w3"}) {
			return fmt.Errorf("running workers %v", listed)
		}
		return nil
	})
	t.Logf("fleetctl worker ls (from the host): %v running", listed)

	// The indexer wrote the smoke messages into the state database:
	// fleetctl search finds them through the fleet.api service.
	waitFor(t, time.Minute, "fleetctl search to find the smoke message", func() error {
		cmd := exec.Command(bin, "search", "--json", "--role", "user", "ingress1")
		cmd.Env = append(s.env, "NATS_URL="+s.natsURLs, "AGENTFLEET_NATS_USER=admin", "AGENTFLEET_NATS_PASSWORD="+adminPassword)
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("fleetctl search: %v %s", err, out)
		}
		var doc struct {
			Results []struct {
				Role    string `json:"role"`
				Snippet string `json:"snippet"`
			} `json:"results"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			return fmt.Errorf("fleetctl search --json: %v: %s", err, out)
		}
		for _, r := range doc.Results {
			if r.Role == "user" && strings.Contains(r.Snippet, "hello through") {
				return nil
			}
		}
		return fmt.Errorf("not found yet: %s", out)
	})
}
