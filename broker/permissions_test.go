package broker_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
)

// roleConn connects as a user of role, and collects the server's
// permission violations for it.
type roleConn struct {
	nc         *nats.Conn
	violations chan string
}

func connectRole(t *testing.T, url, role string) *roleConn {
	t.Helper()
	rc := &roleConn{violations: make(chan string, 64)}
	nc, err := nats.Connect(url, nats.UserInfo(role, role+"-pw"), nats.CustomInboxPrefix("_INBOX_"+role),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				rc.violations <- err.Error()
			}
		}))
	if err != nil {
		t.Fatalf("%s: %v", role, err)
	}
	t.Cleanup(nc.Close)
	rc.nc = nc
	return rc
}

// refused runs op, which must be refused by the server: a permission
// violation naming subject arrives.
func (rc *roleConn) refused(t *testing.T, what, subject string, op func(ctx context.Context)) {
	t.Helper()
	// A refused request gets no answer: the op gives up after a while.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	op(ctx)
	cancel()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case v := <-rc.violations:
			if strings.Contains(v, `"`+subject+`"`) {
				return
			}
		case <-deadline:
			t.Errorf("%s: no permission violation for %s", what, subject)
			return
		}
	}
}

// TestRolesAreRefusedOutsideTheirSets: each role tries what its set leaves
// out (forging a reply, reading transcripts, deleting a stream, admin
// subjects) and the server refuses each with a permission violation,
// while what the role is for still works.
func TestRolesAreRefusedOutsideTheirSets(t *testing.T) {
	var users []broker.ServerUser
	for _, role := range []string{broker.RoleAdmin, broker.RoleIngress, broker.RoleWorker, broker.RoleIndexer, broker.RoleHealthcheck, broker.RoleConsole} {
		users = append(users, broker.ServerUser{User: role, Password: role + "-pw", Role: role, InboxPrefix: "_INBOX_" + role})
	}
	srv, err := broker.StartServer(broker.ServerConfig{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Users: users})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := broker.MustNames("")
	admin := connectRole(t, srv.ClientURL(), broker.RoleAdmin)
	ajs, _ := jetstream.New(admin.nc)
	if _, err := broker.Provision(ctx, ajs, broker.ProvisionConfig{}); err != nil {
		t.Fatal(err)
	}
	// A transcript entry to try to read.
	if _, err := ajs.Publish(ctx, n.TranscriptSubject("s1"), []byte("secret")); err != nil {
		t.Fatal(err)
	}
	short := func(rc *roleConn) jetstream.JetStream {
		js, _ := jetstream.New(rc.nc, jetstream.WithDefaultTimeout(2*time.Second))
		return js
	}
	pub := func(rc *roleConn, subj string) func(context.Context) {
		return func(context.Context) { _ = rc.nc.Publish(subj, []byte("forged")) }
	}
	sub := func(rc *roleConn, subj string) func(context.Context) {
		return func(context.Context) {
			if s, err := rc.nc.SubscribeSync(subj); err == nil {
				t.Cleanup(func() { _ = s.Unsubscribe() })
			}
		}
	}
	directGet := func(rc *roleConn, stream, subj string) func(context.Context) {
		return func(ctx context.Context) {
			s, err := short(rc).Stream(ctx, stream)
			if err == nil {
				_, _ = s.GetLastMsgForSubject(ctx, subj)
			}
		}
	}

	ing := connectRole(t, srv.ClientURL(), broker.RoleIngress)
	box := n.BoxSubject("http", "lane1")
	ing.refused(t, "ingress forges a reply into the outbox", n.OutboxSubject("http", "lane1"), pub(ing, n.OutboxSubject("http", "lane1")))
	ing.refused(t, "ingress writes a transcript", n.TranscriptSubject("s1"), pub(ing, n.TranscriptSubject("s1")))
	ing.refused(t, "ingress reads a transcript", "$JS.API.DIRECT.GET."+n.TranscriptStream()+"."+n.TranscriptSubject("s1"),
		directGet(ing, n.TranscriptStream(), n.TranscriptSubject("s1")))
	ing.refused(t, "ingress deletes a stream", "$JS.API.STREAM.DELETE."+n.InboxStream(), func(ctx context.Context) { _ = short(ing).DeleteStream(ctx, n.InboxStream()) })
	ing.refused(t, "ingress reads another role's replies", "_INBOX_worker.>", sub(ing, "_INBOX_worker.>"))
	ing.refused(t, "ingress listens to the worker's inbox hints", n.HintWildcard(), sub(ing, n.HintWildcard()))
	// What it is for: publishing to the inbox.
	if _, err := short(ing).Publish(ctx, n.InboxSubject(1, "lane1"), []byte("hi")); err != nil {
		t.Errorf("ingress cannot publish to the inbox: %v", err)
	}
	_ = box

	wrk := connectRole(t, srv.ClientURL(), broker.RoleWorker)
	wrk.refused(t, "worker purges a stream", "$JS.API.STREAM.PURGE."+n.TranscriptStream(), func(ctx context.Context) {
		if s, err := short(wrk).Stream(ctx, n.TranscriptStream()); err == nil {
			_ = s.Purge(ctx)
		} else {
			t.Errorf("worker stream info: %v", err)
		}
	})
	wrk.refused(t, "worker deletes a stream", "$JS.API.STREAM.DELETE."+n.OutboxStream(), func(ctx context.Context) { _ = short(wrk).DeleteStream(ctx, n.OutboxStream()) })
	wrk.refused(t, "worker changes a stream", "$JS.API.STREAM.UPDATE."+n.InboxStream(), func(ctx context.Context) {
		_, _ = short(wrk).UpdateStream(ctx, jetstream.StreamConfig{Name: n.InboxStream(), Subjects: []string{n.InboxWildcard()}})
	})
	wrk.refused(t, "worker writes a mailbox", box, pub(wrk, box))
	wrk.refused(t, "worker deletes a consumer", "$JS.API.CONSUMER.DELETE."+n.OutboxStream()+".deliver_http", func(ctx context.Context) {
		_ = short(wrk).DeleteConsumer(ctx, n.OutboxStream(), "deliver_http")
	})
	wrk.refused(t, "worker calls the state database's API", n.APISubject("stats"), pub(wrk, n.APISubject("stats")))
	wrk.refused(t, "worker hears another stream's advisories", "$JS.EVENT.ADVISORY.STREAM.DELETED."+n.TranscriptStream(),
		sub(wrk, "$JS.EVENT.ADVISORY.STREAM.DELETED."+n.TranscriptStream()))
	if _, err := short(wrk).Publish(ctx, n.TranscriptSubject("s1"), []byte("entry")); err != nil {
		t.Errorf("worker cannot append a transcript: %v", err)
	}

	idx := connectRole(t, srv.ClientURL(), broker.RoleIndexer)
	idx.refused(t, "indexer publishes to the inbox", n.InboxSubject(1, "lane1"), pub(idx, n.InboxSubject(1, "lane1")))
	idx.refused(t, "indexer writes a transcript", n.TranscriptSubject("s1"), pub(idx, n.TranscriptSubject("s1")))
	idx.refused(t, "indexer writes a session record", "$KV."+n.SessionsBucket()+".lane1", pub(idx, "$KV."+n.SessionsBucket()+".lane1"))
	idx.refused(t, "indexer deletes a stream", "$JS.API.STREAM.DELETE."+n.TranscriptStream(), func(ctx context.Context) { _ = short(idx).DeleteStream(ctx, n.TranscriptStream()) })

	hc := connectRole(t, srv.ClientURL(), broker.RoleHealthcheck)
	hc.refused(t, "healthcheck publishes to the inbox", n.InboxSubject(1, "lane1"), pub(hc, n.InboxSubject(1, "lane1")))
	hc.refused(t, "healthcheck reads a transcript", "$JS.API.DIRECT.GET."+n.TranscriptStream()+"."+n.TranscriptSubject("s1"),
		directGet(hc, n.TranscriptStream(), n.TranscriptSubject("s1")))
	hc.refused(t, "healthcheck takes a lease", "$KV."+n.LeasesBucket()+".lane1", pub(hc, "$KV."+n.LeasesBucket()+".lane1"))

	con := connectRole(t, srv.ClientURL(), broker.RoleConsole)
	con.refused(t, "console forges a reply", n.OutboxSubject("http", "lane1"), pub(con, n.OutboxSubject("http", "lane1")))
	con.refused(t, "console deletes a stream", "$JS.API.STREAM.DELETE."+n.EventStream(), func(ctx context.Context) { _ = short(con).DeleteStream(ctx, n.EventStream()) })
	// What the console adds to the ingress: reading transcripts.
	s, err := short(con).Stream(ctx, n.TranscriptStream())
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.GetLastMsgForSubject(ctx, n.TranscriptSubject("s1")); err != nil || string(m.Data) != "entry" {
		t.Errorf("console cannot read a transcript: %v", err)
	}

	// The admin may do anything in the fleet's account.
	if err := ajs.DeleteConsumer(ctx, n.InboxStream(), n.WorkersConsumer()); err != nil {
		t.Errorf("admin: %v", err)
	}
	select {
	case v := <-admin.violations:
		t.Errorf("admin got a violation: %s", v)
	default:
	}
}

var update = flag.Bool("update", false, "rewrite the permission table in docs/security.md")

const (
	securityDoc = "../docs/security.md"
	permBegin   = "<!-- BEGIN PERMISSION TABLE: generated from broker.Permissions by `go test ./broker -run TestPermissionTableInDocs -update`; do not edit -->"
	permEnd     = "<!-- END PERMISSION TABLE -->"
)

func permissionTable(t *testing.T) string {
	var b strings.Builder
	b.WriteString("| Role | Publish | Subscribe | Replies to requests it received |\n|---|---|---|---|\n")
	code := func(s []string) string {
		out := make([]string, len(s))
		for i, x := range s {
			out[i] = "`" + x + "`"
		}
		return strings.Join(out, "<br>")
	}
	for _, role := range broker.Roles() {
		p, err := broker.Permissions(role, broker.MustNames(""), "_INBOX_"+role)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case role == broker.RoleSystem:
			b.WriteString("| `" + role + "` | everything in the system account | everything in the system account; no fleet subject | yes |\n")
			continue
		case p == nil:
			b.WriteString("| `" + role + "` | everything | everything | yes |\n")
			continue
		}
		resp := "no"
		if p.Response != nil {
			resp = "yes"
		}
		b.WriteString("| `" + role + "` | " + code(p.Publish.Allow) + " | " + code(p.Subscribe.Allow) + " | " + resp + " |\n")
	}
	return b.String()
}

// TestPermissionTableInDocs: docs/security.md shows the permission sets the
// code gives.
func TestPermissionTableInDocs(t *testing.T) {
	data, err := os.ReadFile(securityDoc)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok1 := strings.Cut(string(data), permBegin+"\n")
	_, after, ok2 := strings.Cut(rest, permEnd)
	if !ok1 || !ok2 {
		t.Fatalf("%s lacks the permission table markers", securityDoc)
	}
	want := before + permBegin + "\n" + permissionTable(t) + permEnd + after
	if *update {
		if err := os.WriteFile(securityDoc, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if string(data) != want {
		t.Error("docs/security.md's permission table is stale: run go test ./broker -run TestPermissionTableInDocs -update")
	}
}
