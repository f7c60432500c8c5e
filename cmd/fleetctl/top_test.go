package main

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/agentfleet/agentfleet/test/natstest"
)

func fixedSnapshot() topSnapshot {
	return topSnapshot{At: t0, topStats: topStats{Turns: 744, TurnsPerSec: 12.4, Failures: 2, DeadLetters: 1, P50: "1.2s", P90: "3.4s", P99: "8s"},
		Backlog: 4, InFlight: 2, Workers: []topWorker{{Owner: "host-a/0a1b2c3d", State: "running", Lanes: 12, TurnsRunning: 3, Turns: 1500},
			{Owner: "host-b/99887766", State: "draining", Lanes: 1, TurnsRunning: 1, Turns: 88}}}
}

func TestTurnSamplerWindowAndPercentiles(t *testing.T) {
	s := &turnSampler{}
	now := t0
	s.add(turnSample{at: now.Add(-2 * time.Minute), latency: time.Hour}) // outside the window
	for i := 1; i <= 100; i++ {
		s.add(turnSample{at: now.Add(-time.Duration(i) * 100 * time.Millisecond), latency: time.Duration(i) * time.Millisecond, failed: i%25 == 0})
	}
	s.addDeadLetter(now.Add(-time.Second))
	st := s.stats(now, time.Minute)
	if st.Turns != 100 || st.Failures != 4 || st.DeadLetters != 1 || st.P50 != "50ms" || st.P90 != "90ms" || st.P99 != "99ms" {
		t.Fatalf("%+v", st)
	}
	if st.TurnsPerSec < 1.66 || st.TurnsPerSec > 1.67 {
		t.Fatalf("turns/s %v, want 100/60", st.TurnsPerSec)
	}
	if empty := (&turnSampler{}).stats(now, time.Minute); empty.P50 != "-" || empty.Turns != 0 {
		t.Fatalf("empty window: %+v", empty)
	}
}

func TestTopModel(t *testing.T) {
	fetches := 0
	m := topModel{fetch: func() (topSnapshot, error) { fetches++; return fixedSnapshot(), nil }, interval: time.Second}
	if !strings.Contains(m.View(), "reading the fleet") {
		t.Fatalf("first view: %q", m.View())
	}
	msg := m.Init()()
	next, cmd := m.Update(msg)
	if fetches != 1 || cmd == nil {
		t.Fatalf("fetches %d, cmd %v", fetches, cmd)
	}
	golden(t, "top", []byte(next.View()))
	// A tick fetches again.
	next, cmd = next.Update(tickMsg{})
	if _, ok := cmd().(snapMsg); !ok || fetches != 2 {
		t.Fatalf("tick: fetches %d", fetches)
	}
	for _, k := range []tea.KeyMsg{{Type: tea.KeyRunes, Runes: []rune("q")}, {Type: tea.KeyCtrlC}, {Type: tea.KeyEsc}} {
		_, cmd = next.Update(k)
		if cmd == nil {
			t.Fatalf("%s: no command", k)
		}
		if _, ok := cmd().(tea.QuitMsg); !ok {
			t.Fatalf("%s does not quit", k)
		}
	}
	if _, cmd = next.Update(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("x")}); cmd != nil {
		t.Fatal("x does something")
	}
}

// syncBuffer is a bytes.Buffer safe for the program's writer and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestTopProgramRedrawsAndQuitsOnQ runs the real bubbletea program on a
// pipe: it draws frames until it reads q.
func TestTopProgramRedrawsAndQuitsOnQ(t *testing.T) {
	in, keys := io.Pipe()
	defer keys.Close()
	var out syncBuffer
	var mu sync.Mutex
	fetches := 0
	m := topModel{fetch: func() (topSnapshot, error) {
		mu.Lock()
		fetches++
		mu.Unlock()
		return fixedSnapshot(), nil
	}, interval: 100 * time.Millisecond}
	p := tea.NewProgram(m, tea.WithInput(in), tea.WithOutput(&out))
	done := make(chan error, 1)
	go func() { _, err := p.Run(); done <- err }()
	natstest.WaitFor(t, 30*time.Second, "two frames drawn", func() error {
		mu.Lock()
		defer mu.Unlock()
		if fetches < 2 || !strings.Contains(out.String(), "host-b/99887766") {
			return io.ErrNoProgress
		}
		return nil
	})
	if _, err := keys.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		p.Kill()
		t.Fatal("top did not quit on q")
	}
}

// TestTopJSONAgainstLiveFleet: `top --json` counts a turn the fleet ran.
func TestTopJSONAgainstLiveFleet(t *testing.T) {
	f := startLiveFleet(t)
	key, seq := f.post("top-1", "top me")
	f.waitCommitted(key, seq)
	var snap struct {
		Turns    int    `json:"turns"`
		Failures int    `json:"failures"`
		P50      string `json:"accept_to_reply_p50"`
		Workers  []struct {
			Owner string `json:"owner"`
		} `json:"workers"`
	}
	jsonCtl(t, &snap, "top", "--json")
	if snap.Turns != 1 || snap.Failures != 0 || snap.P50 == "-" || len(snap.Workers) != 1 || snap.Workers[0].Owner != f.w.Owner() {
		t.Fatalf("top --json: %+v", snap)
	}
}
