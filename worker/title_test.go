package worker_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/transcript"
)

// TestResumeByTitle: /new <title> names a session; /resume <title> returns
// to the newest session of the lane with that title, also after switching
// away to an older one; /resume lists the recent sessions with titles.
func TestResumeByTitle(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.startWorker("w1", mods(noReset))

	lane, s := f.send("titled", "one")
	s1 := f.settled(lane, s).SessionID
	_, s = f.send("titled", "/new alpha")
	s2 := f.settled(lane, s).SessionID
	if n := f.lastNotice(lane); !strings.Contains(n, `"alpha"`) {
		t.Errorf("/new notice %q does not name the title", n)
	}
	_, s = f.send("titled", "two")
	f.settled(lane, s)
	_, s = f.send("titled", "/resume "+s1)
	if got := f.settled(lane, s).SessionID; got != s1 {
		t.Fatalf("/resume by id: session %s, want %s", got, s1)
	}
	_, s = f.send("titled", "/resume ALPHA")
	if got := f.settled(lane, s).SessionID; got != s2 {
		t.Fatalf("/resume by title: session %s, want %s", got, s2)
	}
	_, s = f.send("titled", "three")
	f.settled(lane, s)
	if users := contents(f.effective(s2), transcript.RoleUser); !slices.Equal(users, []string{"two", "three"}) {
		t.Errorf("titled session users %q", users)
	}
	_, s = f.send("titled", "/resume")
	f.settled(lane, s)
	if n := f.lastNotice(lane); !strings.Contains(n, "No other named session") {
		t.Errorf("/resume list %q: the only named session is the current one", n)
	}
	_, s = f.send("titled", "/resume nosuchtitle")
	if got := f.settled(lane, s).SessionID; got != s2 {
		t.Errorf("an unknown title moved the lane to %s", got)
	}
	if n := f.lastNotice(lane); !strings.Contains(n, "No session") {
		t.Errorf("unknown title notice %q", n)
	}
}
