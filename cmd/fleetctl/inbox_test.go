package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/admin"
)

// TestRenderMigrateReport: the summary of `inbox streams` says whether the
// count changed, how many partition moves it took, and what the look for
// stray messages found; a run at the fleet's count says it moved nothing
// to change it.
func TestRenderMigrateReport(t *testing.T) {
	for _, c := range []struct {
		rep  admin.MigrateReport
		want string
	}{
		{admin.MigrateReport{From: 2, To: 2, Took: 3 * time.Millisecond},
			"inbox streams: 2, unchanged; no stray messages found; no partition moved in 3ms\n"},
		{admin.MigrateReport{From: 2, To: 2, Strays: 1, Moved: 1, Took: time.Second, Drain: 200 * time.Millisecond},
			"inbox streams: 2, unchanged; stray messages found in 1 partition and answered; 1 partition move in 1s (longest drain 200ms)\n"},
		{admin.MigrateReport{From: 1, To: 2, Moved: 33, Strays: 1, Took: 2 * time.Second, Drain: 300 * time.Millisecond},
			"inbox streams: 1 -> 2, 33 partition moves in 2s (longest drain 300ms); stray messages found in 1 partition and answered\n"},
		{admin.MigrateReport{From: 3, To: 1, Moved: 42, Took: time.Second, Drain: time.Millisecond},
			"inbox streams: 3 -> 1, 42 partition moves in 1s (longest drain 1ms); no stray messages found\n"},
	} {
		var b bytes.Buffer
		renderMigrateReport(&b, c.rep)
		if got := b.String(); got != c.want {
			t.Errorf("%+v:\n got %q\nwant %q", c.rep, got, c.want)
		}
	}
}
