package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// TestCrashPoints kills a worker process (AGENTFLEET_CRASH_AT makes it
// SIGKILL itself) at each durable step of its first turn, then lets a normal
// worker take over: the reply is delivered exactly once, the session id is
// the one recorded before the crash, the user entry and the tool calls are
// in the transcript once.
func TestCrashPoints(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.startIngress()

	for _, point := range []string{"after_append", "after_reply", "after_commit"} {
		t.Run(point, func(t *testing.T) {
			// The cluster's helpers report to the running subtest.
			parent := c.t
			c.t = t
			defer func() { c.t = parent }()
			chat := "crash-" + strings.ReplaceAll(point, "_", "-")
			crasher := c.startWorker("crash-"+point, "AGENTFLEET_CRASH_AT="+point)
			a := c.post(chat, "crash "+point+"\n!tools 2", "")

			st := crasher.waitExit(30 * time.Second)
			if st == nil {
				t.Fatalf("the worker with AGENTFLEET_CRASH_AT=%s did not crash", point)
			}
			if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the crashing worker ended with %v, want SIGKILL", st)
			}
			crashedAt := time.Now()

			// What the crash left behind: the state the recovery must reuse.
			before := c.mustEntry(a.SessionKey)
			sid := before.SessionID
			if sid == "" {
				t.Fatalf("no session id recorded before the crash: %+v", before)
			}
			pre := c.load(sid)
			hasReply := len(replyEntries(pre)) > 0
			switch point {
			case "after_append":
				if before.Turn == nil || before.Turn.SessionID != sid || len(userEntries(pre)) != 1 || hasReply {
					t.Fatalf("after_append: turn %+v, %d user entries, reply %v: the crash was not right after the user entry",
						before.Turn, len(userEntries(pre)), hasReply)
				}
			case "after_reply":
				if before.Turn == nil || !hasReply || before.CommittedSeq >= a.Seq {
					t.Fatalf("after_reply: turn %+v, reply %v, committed %d: the crash was not between reply and commit",
						before.Turn, hasReply, before.CommittedSeq)
				}
				// The reply went out before the crash: it reaches the
				// mailbox with no worker running. The recovery publishes it
				// again (same Msg-Id); "once" below shows that is dropped.
				c.waitReplies(a.SessionKey, 1, 30*time.Second)
				waitFor(t, 30*time.Second, "the reply published before the crash to be delivered", c.delivered)
			case "after_commit":
				if before.Turn != nil || before.CommittedSeq < a.Seq {
					t.Fatalf("after_commit: turn %+v, committed %d: the crash was not after the commit", before.Turn, before.CommittedSeq)
				}
				// The delivery was not acked: it comes back to the rescuer,
				// which finds it committed and acks it without a turn.
				if info, err := c.res.Consumer.Info(t.Context()); err != nil || info.NumAckPending+int(info.NumPending) == 0 {
					t.Fatalf("after_commit: workers consumer %+v (%v): the delivery was acked before the crash", info, err)
				}
			}

			rescuer := c.startWorker("rescue-" + point)
			c.waitReplies(a.SessionKey, 1, 30*time.Second)
			waitFor(t, 30*time.Second, "the lane to settle", func() error {
				if err := c.committed(a.SessionKey, a.Seq); err != nil {
					return err
				}
				if err := c.delivered(); err != nil {
					return err
				}
				return c.inboxSettled()
			})
			t.Logf("%s: lane settled %v after the crash", point, time.Since(crashedAt).Round(time.Millisecond))

			after := c.mustEntry(a.SessionKey)
			if after.SessionID != sid {
				t.Errorf("session id %s after recovery, %s before the crash", after.SessionID, sid)
			}
			entries := c.load(sid)
			users := userEntries(entries)
			if len(users) != 1 || users[0].InboxSeq != a.Seq || users[0].Content != "crash "+point+"\n!tools 2" {
				t.Errorf("user entries %+v, want the message once", users)
			}
			calls, results := 0, 0
			for _, e := range transcript.Effective(entries) {
				if len(e.ToolCalls) > 0 {
					calls++
				}
				if e.Role == transcript.RoleTool {
					results++
				}
			}
			if calls != 2 || results != 2 {
				t.Errorf("%d tool calls and %d tool results in the transcript, want 2 and 2", calls, results)
			}
			box := c.allReplies(a.SessionKey)
			if len(box) != 1 || box[0].Text != "echo: crash "+point || box[0].Kind != session.ReplyKindReply || box[0].SessionID != sid {
				t.Errorf("mailbox %+v, want one reply \"echo: crash %s\" in session %s", box, point, sid)
			}
			if n := checkRepliesOnce(t, a.SessionKey, entries, box); n != 1 {
				t.Errorf("%d completed turns with a reply, want 1", n)
			}
			// The rescuer resumed the turn (same id, attempt 2) where the
			// crash left it unfinished, and ran no turn after a commit.
			starts := 0
			for _, ev := range c.laneTurnEvents(session.LaneToken(a.SessionKey)) {
				if ev.Type != "start" {
					continue
				}
				starts++
				if ev.Attempt >= 2 && (ev.TurnID != before.LastTurnID && (before.Turn == nil || ev.TurnID != before.Turn.ID) || ev.SessionID != sid) {
					t.Errorf("resumed attempt %+v is not the crashed turn in session %s", ev, sid)
				}
			}
			if want := map[string]int{"after_append": 2, "after_reply": 1, "after_commit": 1}[point]; starts != want {
				t.Errorf("%d turn starts, want %d (the crashed attempt%s)", starts, want, map[bool]string{true: " and its resumption", false: ""}[want == 2])
			}

			rescuer.signal(syscall.SIGTERM)
			if st := rescuer.waitExit(20 * time.Second); st == nil || !st.Success() {
				t.Fatalf("the rescuing worker did not exit 0 after SIGTERM: %v", st)
			}
		})
	}
}
