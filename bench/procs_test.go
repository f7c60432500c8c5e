package bench_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bench"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// workerBinary builds the agentfleet binary once per test run.
func workerBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs worker processes; skipped with -short")
	}
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "agentfleet-bench-bin-*")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "agentfleet")
		out, err := exec.Command("go", "build", "-o", binPath, "../cmd/agentfleet").CombinedOutput()
		if err != nil {
			binErr = err
			binPath = string(out)
		}
	})
	if binErr != nil {
		t.Fatalf("go build ../cmd/agentfleet: %v\n%s", binErr, binPath)
	}
	return binPath
}

// TestTakeoverSmoke kills one of two worker processes once, with a 3s lease,
// and checks that the long turns it ran resumed elsewhere.
func TestTakeoverSmoke(t *testing.T) {
	bin := workerBinary(t)
	r, err := bench.Takeover(t.Context(), bench.Options{Workers: 2, LeaseTTL: 3 * time.Second, WorkerBinary: bin, DataDir: t.TempDir()},
		bench.TakeoverOptions{Kills: 1, LanesPerRound: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", r)
	if len(r.Samples) == 0 || r.Samples[0] <= 0 {
		t.Fatalf("no resumed turn timed: %+v", r)
	}
}

// TestHandoverSmoke restarts two worker processes in turn under load on 4
// lanes and checks that nothing was lost or duplicated.
func TestHandoverSmoke(t *testing.T) {
	bin := workerBinary(t)
	r, err := bench.Handover(t.Context(), bench.Options{Workers: 2, Lanes: 4, LeaseTTL: 3 * time.Second, WarmupTurns: 1,
		WorkerBinary: bin, DataDir: t.TempDir()},
		bench.HandoverOptions{TurnSleep: 50 * time.Millisecond, Settle: 500 * time.Millisecond, DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", r)
	if r.Lost != 0 || r.Duplicated != 0 || len(r.Problems) != 0 {
		t.Fatalf("lost %d duplicated %d problems %v", r.Lost, r.Duplicated, r.Problems)
	}
	if r.Turns == 0 || len(r.Restarts) != 2 {
		t.Fatalf("turns %d restarts %d", r.Turns, len(r.Restarts))
	}
}
