package ingress_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentfleet/agentfleet/ingress"
)

func TestSplit(t *testing.T) {
	t.Parallel()
	if got := ingress.Split("short", 100, ingress.RuneLen); len(got) != 1 || got[0] != "short" {
		t.Errorf("short text: %q", got)
	}
	if got := ingress.Split("  \n ", 100, ingress.RuneLen); len(got) != 0 {
		t.Errorf("blank text: %q", got)
	}
	// Paragraphs are kept whole when they fit.
	text := strings.Repeat("word ", 10) + "\n" + strings.Repeat("more ", 10) + "\n" + strings.Repeat("last ", 10)
	got := ingress.Split(text, 60, ingress.RuneLen)
	if len(got) != 3 || !strings.HasPrefix(got[1], "more") || !strings.HasPrefix(got[2], "last") {
		t.Errorf("lines: %q", got)
	}
	// A long line without newlines is cut at spaces, in order.
	line := strings.Repeat("abcdefghi ", 50)
	got = ingress.Split(line, 64, ingress.RuneLen)
	if strings.Join(got, "") != line {
		t.Errorf("cutting a line lost text: %q", got)
	}
	for _, c := range got {
		if ingress.RuneLen(c) > 64 {
			t.Errorf("chunk of %d", ingress.RuneLen(c))
		}
	}
	// A code block cut in two is closed and reopened with its language.
	code := "intro\n```python\n" + strings.Repeat("print('x')\n", 20) + "```\noutro"
	got = ingress.Split(code, 80, ingress.RuneLen)
	if len(got) < 3 {
		t.Fatalf("code: %q", got)
	}
	for i, c := range got {
		if strings.Count(c, "```")%2 != 0 {
			t.Errorf("chunk %d leaves a fence open: %q", i, c)
		}
		if i > 0 && i < len(got)-1 && !strings.HasPrefix(c, "```python") {
			t.Errorf("chunk %d does not reopen the block: %q", i, c)
		}
	}
	// UTF-16 measure: an emoji counts two.
	if ingress.UTF16Len("a🚀") != 3 || ingress.RuneLen("a🚀") != 2 {
		t.Error("lengths")
	}
}

// FuzzSplit: chunks are within the limit, valid UTF-8 when the input is,
// and (outside code fences, which Split closes and reopens) hold the
// whole text in order.
func FuzzSplit(f *testing.F) {
	f.Add("hello\n```go\nx := 1\n```\nbye", 20)
	f.Add(strings.Repeat("🚀 ", 100), 16)
	f.Add("a\n\n\nb", 16)
	f.Fuzz(func(t *testing.T, text string, limit int) {
		if limit < 16 || limit > 5000 {
			return
		}
		chunks := ingress.Split(text, limit, ingress.UTF16Len)
		for _, c := range chunks {
			if n := ingress.UTF16Len(c); n > limit {
				t.Fatalf("chunk of %d units over the limit %d: %q", n, limit, c)
			}
			if utf8.ValidString(text) && !utf8.ValidString(c) {
				t.Fatalf("chunk is not valid UTF-8: %q", c)
			}
		}
		if !strings.Contains(text, "```") {
			joined := strings.Join(chunks, "")
			if strings.ReplaceAll(joined, "\n", "") != strings.ReplaceAll(strings.TrimRight(text, "\n"), "\n", "") && strings.TrimSpace(text) != "" {
				// Newlines at cut points are dropped; everything else stays, in order.
				if strings.Join(strings.Fields(joined), " ") != strings.Join(strings.Fields(text), " ") {
					t.Fatalf("text changed:\n%q\n%q", text, chunks)
				}
			}
		}
	})
}
