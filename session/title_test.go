package session_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/session"
)

func TestSanitizeTitle(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want, err string }{
		{in: "Fix Docker Build", want: "Fix Docker Build"},
		{in: "  Fix \t Docker\n\nBuild  ", want: "Fix Docker Build"},
		{in: "a\x00b\x07c\x7fd", want: "abcd"},
		{in: "\ufeffTitle\u200b with\u200d zero\u2060width\u202e", want: "Title with zerowidth"},
		{in: "line\u2028sep", want: "linesep"},
		{in: "café ☕ 日本", want: "café ☕ 日本"},
		{in: strings.Repeat("é", 100), want: strings.Repeat("é", 100)},
		{in: " " + strings.Repeat("x", 100) + "\u200b ", want: strings.Repeat("x", 100)},
		{in: strings.Repeat("x", 101), err: "too long (101 characters, at most 100)"},
		{in: "\x00\u200b \t\ufeff", err: "empty"},
		{in: "", err: "empty"},
	} {
		got, err := session.SanitizeTitle(tc.in)
		if tc.err != "" {
			if err == nil || !errors.Is(err, session.ErrInvalidTitle) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("SanitizeTitle(%q) = %q, %v; want an error saying %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("SanitizeTitle(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
