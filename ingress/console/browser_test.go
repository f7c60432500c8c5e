package console_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/statedb"
	"github.com/agentfleet/agentfleet/test/natstest"
)

// findChromium is the headless browser of the browser tests: $CHROMIUM, or
// Debian's chromium on the PATH. Without one the tests skip, saying so —
// except in CI (CI=true), where a missing browser fails them.
func findChromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on this machine: the browser tests need it in CI (apt-get install -y chromium; .ci/run installs it)")
	}
	t.Skip("browser tests SKIPPED: no chromium on this machine (apt-get install -y chromium, or set CHROMIUM to a Chrome binary)")
	return ""
}

// browser starts one headless Chromium for the test; its tabs share it.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := findChromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("lang", "en-US"))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, bcancel := chromedp.NewContext(actx)
	if err := chromedp.Do(bctx); err != nil { // start the browser
		bcancel()
		acancel()
		t.Fatalf("start chromium %s: %v", path, err)
	}
	t.Cleanup(func() { bcancel(); acancel() })
	return bctx
}

// run runs browser actions with a generous deadline (the machine is busy).
func run(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, actions...); err != nil {
		pageFail(t, ctx, what, err)
	}
}

// get runs one browser action that reads a value.
func get[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	v, err := chromedp.Run(tctx, a)
	if err != nil {
		pageFail(t, ctx, what, err)
	}
	return v
}

func pageFail(t *testing.T, ctx context.Context, what string, err error) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	loc, _ := chromedp.Run(tctx, chromedp.Location())
	body, _ := chromedp.Run(tctx, chromedp.Evaluate[string](`document.querySelector("main") ? document.querySelector("main").innerText : ""`))
	t.Fatalf("%s: %v (page %s: %.600s)", what, err, loc, body)
}

// waitJS waits until the expression is true in the page.
func waitJS(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(80*time.Second))
}

// screenshot writes the page to $CONSOLE_SCREENSHOTS/console-<name>.png
// when that is set (make screenshots); normal runs write nothing.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	png := get(t, ctx, "screenshot "+name, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join(dir, "console-"+name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func js(s string, a ...any) string { return fmt.Sprintf(s, a...) }

// TestConsoleInBrowser drives the console in a real headless Chromium
// against a fleet running turns: a lane turns from running to idle on the
// Lanes page without a reload, a transcript shows a tool call, a search
// finds a message, a /stop from the console suspends the lane, and a dead
// letter is replayed.
func TestConsoleInBrowser(t *testing.T) {
	ctx := browser(t)
	f := startFleet(t)
	base := f.url + "/console"

	// Some history for the charts and the search.
	lane0, s0 := f.post("warmup", "good morning, the zebra crossing is closed today")
	f.waitCommitted(lane0, s0)

	// Sign in: the login form, then the page asked for.
	run(t, ctx, "sign in",
		chromedp.Navigate(base+"/lanes"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), adminToken),
		chromedp.Submit(chromedp.ID("token")),
		chromedp.WaitVisible(chromedp.ID("lane-rows")),
	)

	t.Run("Keyboard", func(t *testing.T) {
		// The first Tab reaches the skip link; Enter on it moves the focus
		// to the page's content.
		run(t, ctx, "keyboard",
			chromedp.Navigate(base+"/lanes"),
			chromedp.WaitVisible(chromedp.ID("lane-rows")),
			chromedp.KeyEvent("\t"),
			waitJS(`document.activeElement && document.activeElement.classList.contains("skip")`),
			chromedp.KeyEvent("\r"),
			waitJS(`document.activeElement && document.activeElement.id === "main"`),
			chromedp.KeyEvent("\t"),
			waitJS(`document.activeElement && document.activeElement.id === "platform"`),
		)
	})

	t.Run("LaneRunningThenIdleWithoutReload", func(t *testing.T) {
		run(t, ctx, "mark the page",
			chromedp.Navigate(base+"/lanes"),
			chromedp.WaitVisible(chromedp.ID("lane-rows")),
			waitJS(`document.querySelector("table.lanes").dataset.live === "on"`),
			chromedp.Evaluate[chromedp.Void](`window.consoleMark = "same page"`),
		)
		lane, seq := f.post("live1", "!sleep 4s\nworking")
		row := js(`document.getElementById(%q)`, "lane-"+lane)
		run(t, ctx, "the lane shows running", waitJS(js(`%s !== null && %s.dataset.state === "running"`, row, row)))
		screenshot(t, ctx, "lanes")
		f.waitCommitted(lane, seq)
		run(t, ctx, "the lane shows idle", waitJS(js(`%s.dataset.state === "idle" && %s.querySelector(".col-state").textContent.trim() === "idle"`, row, row)))
		mark := get(t, ctx, "read the mark", chromedp.Evaluate[string](`window.consoleMark || ""`))
		if mark != "same page" {
			t.Fatalf("the page was reloaded (mark %q)", mark)
		}
	})

	t.Run("TranscriptShowsToolCall", func(t *testing.T) {
		lane, seq := f.post("tools1", "use a tool\n!tools 1")
		f.waitCommitted(lane, seq)
		run(t, ctx, "the transcript",
			chromedp.Navigate(base+"/session/"+lane),
			chromedp.WaitVisible(chromedp.CSS(".transcript")),
		)
		summary := get(t, ctx, "the tool call", chromedp.Text(chromedp.CSS(`.transcript details.tool summary`)))
		// Folded: the arguments show once unfolded.
		run(t, ctx, "unfold the tool call",
			chromedp.Click(chromedp.CSS(`.transcript details.tool summary`)),
			chromedp.WaitVisible(chromedp.CSS(`.transcript details.tool[open] pre`)),
		)
		args := get(t, ctx, "the arguments", chromedp.Text(chromedp.CSS(`.transcript details.tool[open] pre`)))
		result := get(t, ctx, "the tool result", chromedp.Text(chromedp.CSS(`.transcript li.role-tool details summary`)))
		if !strings.Contains(summary, "Tool call echo_tool") || !strings.Contains(args, `"i":1`) || !strings.Contains(result, "Tool result") {
			t.Fatalf("tool call %q, arguments %q, result %q", summary, args, result)
		}
		screenshot(t, ctx, "session")
	})

	t.Run("SearchFindsMessage", func(t *testing.T) {
		natstest.WaitFor(t, 60*time.Second, "the indexer to index the message", func() error {
			var resp statedb.SearchResponse
			if err := f.fl.Call(t.Context(), statedb.EndpointSearch, statedb.SearchRequest{Query: "zebra"}, &resp); err != nil {
				return err
			}
			if len(resp.Results) == 0 {
				return errNotYet
			}
			return nil
		})
		run(t, ctx, "search",
			chromedp.Navigate(base+"/search"),
			chromedp.WaitVisible(chromedp.ID("q")),
			chromedp.SendKeys(chromedp.ID("q"), "zebra"),
			chromedp.Submit(chromedp.ID("q")),
			chromedp.WaitVisible(chromedp.CSS(".results mark")),
		)
		marked := get(t, ctx, "the match", chromedp.Text(chromedp.CSS(".results mark")))
		link := get(t, ctx, "the result's link", chromedp.AttributeValue(chromedp.CSS(".results .meta a"), "href")).Value
		e, _, err := f.fl.Store.Get(t.Context(), lane0)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.EqualFold(marked, "zebra") || link != "/console/session/"+e.SessionID {
			t.Fatalf("search: marked %q, link %q (session %s)", marked, link, e.SessionID)
		}
		screenshot(t, ctx, "search")
	})

	t.Run("StopSuspendsLane", func(t *testing.T) {
		lane, _ := f.post("stop1", "!sleep 60s\nlong work")
		f.waitEntry(lane, "the long turn to run", func(e *session.SessionEntry) error {
			if e.Turn == nil {
				return errNotYet
			}
			return nil
		})
		run(t, ctx, "stop from the session page",
			chromedp.Navigate(base+"/session/"+lane),
			chromedp.WaitVisible(chromedp.CSS(`a[href*="op=stop"]`)),
			chromedp.Click(chromedp.CSS(`a[href*="op=stop"]`)),
			chromedp.WaitVisible(chromedp.CSS("form.confirm")),
		)
		screenshot(t, ctx, "confirm")
		run(t, ctx, "confirm the stop",
			chromedp.Click(chromedp.CSS(`form.confirm button[type=submit]`)),
			chromedp.WaitVisible(chromedp.ID("outcome")),
		)
		outcome := get(t, ctx, "the outcome", chromedp.Text(chromedp.ID("outcome")))
		if !strings.Contains(outcome, "Queued /stop for "+lane) {
			t.Fatalf("outcome %q", outcome)
		}
		f.waitEntry(lane, "the /stop to suspend the lane", func(e *session.SessionEntry) error {
			if !e.Suspended || e.Turn != nil {
				return fmt.Errorf("suspended %v, turn %v", e.Suspended, e.Turn != nil)
			}
			return nil
		})
		run(t, ctx, "the session page", chromedp.Navigate(base+"/session/"+lane))
		state := get(t, ctx, "the session's state", chromedp.Text(chromedp.ID("session-state")))
		if strings.TrimSpace(state) != "suspended" {
			t.Fatalf("state %q", state)
		}
	})

	t.Run("DeadLetterReplayed", func(t *testing.T) {
		// A message whose source cannot be recorded beside the entry's
		// (each is larger than half an entry may be) is dead-lettered.
		lane, first := f.postSource("dl1", "first", func(s *session.SessionSource) { s.ChatName = strings.Repeat("n", 600000) })
		f.waitCommitted(lane, first)
		_, bad := f.postSource("dl1", "poison pill", func(s *session.SessionSource) { s.UserIDAlt = strings.Repeat("x", 600000) })
		var seq uint64
		natstest.WaitFor(t, 60*time.Second, "the dead letter", func() error {
			dls, err := f.fl.DeadLetters(t.Context(), f.fl.DeadLetterFilter(lane))
			if err != nil {
				return err
			}
			for _, d := range dls {
				if d.InboxSeq == bad {
					seq = d.Seq
					return nil
				}
			}
			return errNotYet
		})
		card := fmt.Sprintf("#dl-%d", seq)
		run(t, ctx, "the dead letter",
			chromedp.Navigate(base+"/deadletters"),
			chromedp.WaitVisible(chromedp.CSS(card)),
		)
		reason := get(t, ctx, "the reason", chromedp.Text(chromedp.CSS(card+" .fields dd")))
		if !strings.Contains(reason, "cannot be recorded") {
			t.Fatalf("reason %q", reason)
		}
		screenshot(t, ctx, "deadletters")
		run(t, ctx, "replay it",
			chromedp.Click(chromedp.CSS(card+` a[href*="op=dlq_replay"]`)),
			chromedp.WaitVisible(chromedp.CSS("form.confirm")),
			chromedp.Click(chromedp.CSS(`form.confirm button[type=submit]`)),
			chromedp.WaitVisible(chromedp.ID("outcome")),
		)
		outcome := get(t, ctx, "the outcome", chromedp.Text(chromedp.ID("outcome")))
		var at uint64
		if _, err := fmt.Sscanf(outcome, fmt.Sprintf("Replayed dead letter %d into %s at inbox seq %%d.", seq, lane), &at); err != nil {
			t.Fatalf("outcome %q: %v", outcome, err)
		}
		raw, err := f.fl.Res.Inbox.GetMsg(t.Context(), at)
		if err != nil || !strings.Contains(string(raw.Data), "poison pill") || !strings.HasSuffix(raw.Subject, "."+lane) {
			t.Fatalf("inbox seq %d: %v %s", at, err, raw.Subject)
		}
		// The fleet took the replay up: it ran into the same wall, and was
		// dead-lettered again, as itself.
		natstest.WaitFor(t, 60*time.Second, "the replay to be handled", func() error {
			dls, err := f.fl.DeadLetters(t.Context(), f.fl.DeadLetterFilter(lane))
			if err != nil {
				return err
			}
			for _, d := range dls {
				if d.InboxSeq == at {
					return nil
				}
			}
			return errNotYet
		})
	})

	t.Run("FleetAndEventsPages", func(t *testing.T) {
		run(t, ctx, "the fleet page",
			chromedp.Navigate(base+"/fleet"),
			chromedp.WaitVisible(chromedp.CSS(".charts svg")),
			waitJS(`document.querySelectorAll(".charts svg rect.bar").length > 0`),
			waitJS(`document.body.textContent.includes("console-w1")`),
		)
		screenshot(t, ctx, "fleet")
		run(t, ctx, "the events page",
			chromedp.Navigate(base+"/events"),
			chromedp.WaitVisible(chromedp.CSS("#event-rows tr")),
			waitJS(`document.querySelector("table.events").dataset.live === "on"`),
			chromedp.Evaluate[chromedp.Void](`window.consoleMark = "events"`),
		)
		lane, _ := f.post("tail1", "tail me")
		run(t, ctx, "a new event arrives live",
			waitJS(js(`Array.from(document.querySelectorAll("#event-rows a")).some(a => a.textContent === %q) && window.consoleMark === "events"`, lane)))
		screenshot(t, ctx, "events")
		if os.Getenv("CONSOLE_SCREENSHOTS") != "" {
			run(t, ctx, "phone", chromedp.EmulateViewport(390, 844), chromedp.Navigate(base+"/lanes"), chromedp.WaitVisible(chromedp.ID("lane-rows")))
			screenshot(t, ctx, "lanes-phone")
			run(t, ctx, "desktop", chromedp.EmulateViewport(1280, 900))
		}
	})
}
