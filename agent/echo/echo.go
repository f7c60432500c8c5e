// Package echo is the deterministic agent for development and tests. Its
// reply to a turn is "echo: " followed by the turn's user texts joined by a
// newline, streamed line by line as deltas while the turn runs (a turn cut
// short returns what it streamed as its partial reply). Lines starting with '!' are directives, not text:
//
//	!sleep DUR   wait DUR, stopping at once when the turn is cancelled
//	!tools N     emit N tool-call/tool-result pairs, each persisted before the next
//	!say TEXT    send TEXT at once as an interim message (a reply of its own)
//	!notes       list every system note of the turn, one per line, "note: " first
//	!fail        the turn returns an error
//	!crash       exit the process mid-turn (only when crashes are allowed)
package echo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/agent"
)

// Options configure the echo agent.
type Options struct {
	// AllowCrash lets !crash exit the process. Defaults to false, which makes
	// !crash an error instead.
	AllowCrash bool
	// Exit is called by !crash. Defaults to os.Exit(3).
	Exit func()
}

// Agent is the echo agent. It is stateless and safe for concurrent use.
type Agent struct {
	opts Options
}

var _ agent.Agent = (*Agent)(nil)

// New returns an echo agent.
func New(opts Options) *Agent {
	if opts.Exit == nil {
		opts.Exit = func() { os.Exit(3) }
	}
	return &Agent{opts: opts}
}

// Backend returns an agent.Backend that hands out the same echo agent.
func Backend(opts Options) agent.Backend {
	a := New(opts)
	return agent.BackendFunc(func(context.Context, string, string) (agent.Agent, error) { return a, nil })
}

// Close does nothing: the echo agent holds nothing.
func (a *Agent) Close() error { return nil }

// ErrFail is returned by the !fail directive.
var ErrFail = errors.New("echo: !fail directive")

// Run implements agent.Agent.
func (a *Agent) Run(ctx context.Context, t *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
	var reply strings.Builder // what was streamed so far: the partial reply
	lines := 0
	say := func(line string) error {
		piece := "\n" + line
		if lines == 0 {
			piece = "echo: " + line
		}
		lines++
		reply.WriteString(piece)
		return emit.Delta(ctx, piece)
	}
	// partial is the result of a turn cut short: what was streamed so far.
	partial := func() *agent.Result {
		if reply.Len() == 0 {
			return nil
		}
		return &agent.Result{Text: reply.String(), FinishReason: "interrupted"}
	}
	var steeredTexts []string
	showNotes := false
	for _, m := range t.Messages {
		for _, line := range strings.Split(m.Text, "\n") {
			trimmed := strings.TrimSpace(line)
			if !strings.HasPrefix(trimmed, "!") {
				if err := say(line); err != nil {
					return partial(), err
				}
				continue
			}
			verb, arg, _ := strings.Cut(strings.TrimPrefix(trimmed, "!"), " ")
			arg = strings.TrimSpace(arg)
			switch verb {
			case "sleep":
				d, err := time.ParseDuration(arg)
				if err != nil {
					return nil, fmt.Errorf("echo: !sleep %q: %w", arg, err)
				}
				steered, err := sleep(ctx, d, t.Steer)
				if err != nil {
					return partial(), err
				}
				for _, s := range steered {
					steeredTexts = append(steeredTexts, s.Text)
				}
			case "tools":
				n, err := strconv.Atoi(arg)
				if err != nil || n < 0 || n > 1000 {
					return nil, fmt.Errorf("echo: !tools %q: want a count from 0 to 1000", arg)
				}
				for i := 1; i <= n; i++ {
					id := fmt.Sprintf("%s-call-%d", t.TurnID, i)
					if err := emit.ToolCall(ctx, agent.ToolCall{ID: id, Name: "echo_tool", Arguments: fmt.Sprintf(`{"i":%d}`, i)}); err != nil {
						return nil, err
					}
					if err := emit.ToolResult(ctx, id, "echo_tool", fmt.Sprintf("result %d", i)); err != nil {
						return nil, err
					}
				}
			case "say":
				if err := emit.Message(ctx, arg); err != nil {
					return nil, err
				}
			case "notes":
				showNotes = true
			case "fail":
				return nil, ErrFail
			case "crash":
				if !a.opts.AllowCrash {
					return nil, errors.New("echo: !crash needs a worker started with --allow-crash")
				}
				a.opts.Exit()
				return nil, errors.New("echo: crash")
			default:
				if err := say(line); err != nil { // not a directive we know: plain text
					return partial(), err
				}
			}
		}
	}
	for _, s := range steeredTexts { // steered messages came after the turn's own
		if err := say(s); err != nil {
			return partial(), err
		}
	}
	if lines == 0 {
		reply.WriteString("echo: ")
	}
	if showNotes {
		for _, n := range t.Notes {
			reply.WriteString("\nnote: " + n)
		}
	}
	if err := emit.Usage(ctx, agent.Usage{InputTokens: int64(len(t.Messages)), OutputTokens: 1}); err != nil {
		return nil, err
	}
	return &agent.Result{Text: reply.String(), FinishReason: "stop"}, nil
}

// sleep waits d, stopping at once when ctx is cancelled. In steer mode it
// takes the messages that arrive meanwhile and returns them.
func sleep(ctx context.Context, d time.Duration, steer func(context.Context) ([]agent.UserMessage, error)) ([]agent.UserMessage, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	var poll <-chan time.Time
	if steer != nil {
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		poll = tk.C
	}
	var got []agent.UserMessage
	for {
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-timer.C:
			if steer != nil {
				more, err := steer(ctx)
				if err != nil {
					return nil, err
				}
				got = append(got, more...)
			}
			return got, nil
		case <-poll:
			more, err := steer(ctx)
			if err != nil {
				return nil, err
			}
			got = append(got, more...)
		}
	}
}
