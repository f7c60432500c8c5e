package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

// startIngresses starts one `agentfleet ingress` per name with the
// cluster's environment plus env, waits until each is ready, and returns
// them by pid.
func (c *cluster) startIngresses(env []string, names ...string) map[int]*proc {
	c.t.Helper()
	out := map[int]*proc{}
	for _, name := range names {
		addr := freeAddr(c.t)
		p := newProc(c.t, c.dir, name, append(append([]string(nil), c.env...), env...), "ingress", "--http", addr)
		p.start()
		waitReady(c.t, c.hc, "http://"+addr, p)
		out[p.pid()] = p
	}
	return out
}

// singletonHolder waits until the singleton lease key is held by one of
// procs and returns it (the owner id is <host>-<pid>-<random>).
func (c *cluster) singletonHolder(key string, procs map[int]*proc) *proc {
	c.t.Helper()
	var holder *proc
	waitFor(c.t, startTimeout, "the holder of "+key, func() error {
		e, err := c.res.Leases.Get(c.t.Context(), key)
		if err != nil {
			return err
		}
		var v struct{ Owner string }
		if err := json.Unmarshal(e.Value(), &v); err != nil {
			return err
		}
		parts := strings.Split(v.Owner, "-")
		if len(parts) < 3 {
			return fmt.Errorf("owner %q", v.Owner)
		}
		pid, _ := strconv.Atoi(parts[len(parts)-2])
		if holder = procs[pid]; holder == nil {
			return fmt.Errorf("owner %q is no process of this test", v.Owner)
		}
		return nil
	})
	return holder
}

// checkInboxOnce checks that the inbox holds want distinct platform
// messages, each exactly once. Messages without a platform id (the
// workers' internal wake-ups of a lane) are not platform messages.
func (c *cluster) checkInboxOnce(want int) {
	c.t.Helper()
	counts := map[string]int{}
	for _, m := range c.readStream(c.res.Inbox, c.names.InboxWildcard()) {
		var in session.Inbound
		if err := json.Unmarshal(m.Data, &in); err != nil {
			c.t.Fatal(err)
		}
		if in.PlatformMsgID == "" {
			continue
		}
		counts[in.PlatformMsgID]++
	}
	if len(counts) != want {
		c.t.Errorf("inbox holds %d distinct platform messages, want %d", len(counts), want)
	}
	for id, n := range counts {
		if n != 1 {
			c.t.Errorf("platform message %s is in the inbox %d times", id, n)
		}
	}
}

// checkRepeatsLabelled checks that a text sent to a platform more than once
// carries the "may be a duplicate" label on every later copy.
func checkRepeatsLabelled(t *testing.T, texts []string) {
	t.Helper()
	seen := map[string]int{}
	for _, text := range texts {
		base := strings.TrimPrefix(text, ingress.DuplicateLabel)
		seen[base]++
		if seen[base] > 1 && !strings.HasPrefix(text, ingress.DuplicateLabel) {
			t.Errorf("%q sent again without the duplicate label", base)
		}
	}
}

// waitAnswered waits until texts (as sent by sent()) hold "echo: <prefix><i>"
// for every i in 1..n, labelled or not.
func waitAnswered(t *testing.T, what, prefix string, n int, sent func() []string) {
	t.Helper()
	waitFor(t, 120*time.Second, what, func() error {
		got := map[string]bool{}
		for _, s := range sent() {
			got[strings.TrimPrefix(s, ingress.DuplicateLabel)] = true
		}
		for i := 1; i <= n; i++ {
			if !got[fmt.Sprintf("echo: %s%d", prefix, i)] {
				return fmt.Errorf("no reply to %s%d yet (%d sent)", prefix, i, len(sent()))
			}
		}
		return nil
	})
}
