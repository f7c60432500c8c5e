package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/transcript"
)

// TestZombieFencedByServer complements TestZombieFencing. There the paused
// worker, once resumed, stops itself: its own lease check fails before any
// write leaves the process. Here the worker stops itself (SIGSTOP, through
// AGENTFLEET_PAUSE_AT) right after that check passed, with the write about
// to go to the server: a transcript append, a reply publish, the commit CAS.
// Another worker takes the lane over and completes the turn; then the paused
// one is resumed and its write reaches the server, which must refuse it (the
// fence entry moved the transcript tail; the entry's revision, owner and
// epoch moved; the reply's Msg-Id is a duplicate). Nothing durable changes
// and the user gets the reply once.
func TestZombieFencedByServer(t *testing.T) {
	for _, tc := range []struct {
		point, text string
		// refused matches what the resumed worker logs when the server
		// refuses its write (nil: a refused publish is silent).
		refused *regexp.Regexp
	}{
		{"append:tool", "zombie\n!tools 3", regexp.MustCompile(`lease lost|turn abandoned|conflict`)},
		{"reply", "zombie", regexp.MustCompile(`msg=commit .*lease|lease lost|turn abandoned`)},
		{"commit", "zombie", regexp.MustCompile(`msg=commit .*lease|lease lost`)},
	} {
		t.Run(tc.point, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t)
			c.startIngress()
			debug := "AGENTFLEET_TELEMETRY_LOG_LEVEL=debug"
			a := c.startWorker("za", "AGENTFLEET_PAUSE_AT="+tc.point, debug)
			msg := c.post("zsrv-"+strings.ReplaceAll(tc.point, ":", "-"), tc.text, "")
			key := msg.SessionKey
			lane := session.LaneToken(key)

			waitFor(t, 20*time.Second, "A to stop itself at "+tc.point, func() error {
				if !a.alive() {
					return fatalf("A exited")
				}
				if !processStopped(a.pid()) {
					return errors.New("A still runs")
				}
				return nil
			})
			e := c.mustEntry(key)
			if e.Owner != a.owner || e.Turn == nil {
				t.Fatalf("A paused without a turn in flight: owner %q turn %+v committed %d; A log:\n%s", e.Owner, e.Turn, e.CommittedSeq, a.output())
			}
			epochA, sid, turnID := e.LeaseEpoch, e.Turn.SessionID, e.Turn.ID

			c.startWorker("zb", debug)
			var epochB uint64
			waitFor(t, 30*time.Second, "B to take the lane over and commit the turn", func() error {
				e, err := c.entry(key)
				if err != nil {
					return err
				}
				if e.LeaseEpoch <= epochA || e.Turn != nil || e.CommittedSeq < msg.Seq {
					return fmt.Errorf("owner %q epoch %d committed %d turn %v", e.Owner, e.LeaseEpoch, e.CommittedSeq, e.Turn != nil)
				}
				epochB = e.LeaseEpoch
				return c.delivered()
			})
			outBefore := c.outboxCount(t, lane)

			from := len(a.output())
			a.signal(syscall.SIGCONT)
			if tc.refused != nil {
				line := a.waitLog(30*time.Second, tc.refused)
				if line == "" {
					t.Fatalf("A logged no refusal after SIGCONT; its log since:\n%s", a.output()[from:])
				}
				t.Logf("A after SIGCONT: %s", line)
			}
			waitFor(t, 20*time.Second, "the lane and the mailbox to settle", func() error {
				if err := c.committed(key, msg.Seq); err != nil {
					return err
				}
				return c.delivered()
			})
			if !a.alive() {
				t.Errorf("A died after SIGCONT")
			}

			// The entry is B's: A's commit (if it came to one) was refused.
			if e := c.mustEntry(key); e.LeaseEpoch < epochB || e.LastTurnID != turnID || e.SessionID != sid || e.Owner == a.owner {
				t.Errorf("final entry owner %q epoch %d last turn %s session %s; want B's epoch %d, turn %s, session %s",
					e.Owner, e.LeaseEpoch, e.LastTurnID, e.SessionID, epochB, turnID, sid)
			}
			// Nothing of A's attempt after B's fence.
			entries := c.load(sid)
			fence := -1
			for i, x := range entries {
				if x.Kind == transcript.KindFence && x.Epoch == epochB {
					fence = i
				}
			}
			if fence < 0 {
				t.Fatalf("no fence of B's epoch %d in the transcript", epochB)
			}
			for _, x := range entries[fence+1:] {
				if strings.Contains(x.ID, ":a1:") || (x.Kind == transcript.KindFence && x.Epoch < epochB) {
					t.Errorf("entry %s (%s %s) of A's attempt landed after B's fence", x.ID, x.Kind, x.Role)
				}
			}
			// One reply, in the outbox and in the mailbox.
			if n := c.outboxCount(t, lane); n != outBefore || n != 1 {
				t.Errorf("outbox holds %d replies for the lane (%d before A resumed), want 1", n, outBefore)
			}
			box := c.allReplies(key)
			if len(box) != 1 || box[0].Text != "echo: zombie" {
				t.Errorf("mailbox %+v, want one reply \"echo: zombie\"", box)
			}
			checkRepliesOnce(t, key, entries, box)
		})
	}
}

// processStopped reports whether the process is stopped by a signal (state
// T in /proc/<pid>/stat).
func processStopped(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'T'
}

// outboxCount counts the replies of a lane in the outbox (not the mailbox).
func (c *cluster) outboxCount(t *testing.T, lane string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := 0
	subj := c.names.OutboxSubject(string(session.PlatformHTTP), lane)
	for seq := uint64(1); ; {
		m, err := c.res.Outbox.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		seq = m.Sequence + 1
	}
}
