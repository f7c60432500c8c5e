package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

var update = flag.Bool("update", false, "rewrite the golden files of the human output")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from %s:\n--- got\n%s\n--- want\n%s", name, path, got, want)
	}
}

var t0 = time.Date(2026, 11, 23, 18, 4, 5, 0, time.UTC)

func TestGoldenHumanOutput(t *testing.T) {
	var b bytes.Buffer
	entries := []*session.SessionEntry{
		{SessionKey: "agent:main:telegram:dm:42", SessionID: "20261123_180405_0a1b2c3d", Platform: session.PlatformTelegram, UpdatedAt: t0,
			Owner: "host-a/0a1b2c3d", CommittedSeq: 1207, TotalTokens: 5120, Turn: &session.TurnIntent{ID: "t1"}},
		{SessionKey: "agent:main:slack:group:C1:U2", SessionID: "20261122_090000_ffeeddcc", Platform: session.PlatformSlack, UpdatedAt: t0.Add(-time.Hour),
			CommittedSeq: 9, Suspended: true, ResumePending: true},
	}
	if err := renderSessions(&b, entries); err != nil {
		t.Fatal(err)
	}
	golden(t, "session_ls", b.Bytes())

	b.Reset()
	docs := []workerDoc{
		toWorkerDoc(worker.WorkerRecord{ID: "host-a", Owner: "host-a/0a1b2c3d", Version: "1.2.0", State: worker.StateRunning, Host: "host-a", PID: 4242,
			HeartbeatAt: t0, LanesOwned: 12, TurnsRunning: 3, Turns: 1500, Takeovers: 2, CacheSize: 40, Watcher: true}, t0.Add(2*time.Second)),
		toWorkerDoc(worker.WorkerRecord{ID: "host-b", Owner: "host-b/99887766", Version: "1.2.0", State: worker.StateStopped, Host: "host-b", PID: 7,
			HeartbeatAt: t0.Add(-10 * time.Minute)}, t0),
	}
	if err := renderWorkers(&b, docs); err != nil {
		t.Fatal(err)
	}
	golden(t, "worker_ls", b.Bytes())

	b.Reset()
	if err := renderWorker(&b, docs[0]); err != nil {
		t.Fatal(err)
	}
	golden(t, "worker_info", b.Bytes())

	b.Reset()
	dls := []DeadLetter{{Seq: 88, Lane: "agent.main.http.dm.c1", InboxSeq: 1204, Reason: "interrupted 3 times", At: t0,
		SessionKey: "agent:main:http:dm:c1", Message: session.Inbound{Text: "crash me\n!panic"}}}
	if err := renderDeadLetters(&b, dls); err != nil {
		t.Fatal(err)
	}
	golden(t, "dlq_ls", b.Bytes())

	b.Reset()
	rep := fleetReport{
		Streams: []streamReport{
			{Name: "FLEET_IN", Messages: 1300, Bytes: 456789, Replicas: 3, Retention: "Limits", Storage: "File",
				Consumers: []consumerReport{{Name: "workers", Pending: 4, AckPending: 2, Redelivered: 1, Waiting: 3, MaxDeliver: -1, AckWait: "15.5s"}}},
			{Name: "KV_fleet_leases", Bucket: "fleet_leases", Messages: 12, Bytes: 2048, Replicas: 3, Retention: "Limits", Storage: "File", Consumers: []consumerReport{}},
		},
		Warnings: []string{"FLEET_TX: 1 replica(s), the configuration asks for 3 (nats.replicas)"},
	}
	if err := renderReport(&b, rep); err != nil {
		t.Fatal(err)
	}
	golden(t, "stream_report", b.Bytes())
}
