package session_test

import (
	"regexp"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

var sessionIDRe = regexp.MustCompile(`^\d{8}_\d{6}_[0-9a-f]{8}$`)

func TestNewSessionID(t *testing.T) {
	t.Parallel()
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		paris = time.FixedZone("CEST", 2*3600)
	}
	now := time.Date(2026, 6, 16, 16, 30, 5, 999, paris) // 14:30:05 UTC
	seen := map[string]bool{}
	for range 1000 {
		id := session.NewSessionID(now)
		if !sessionIDRe.MatchString(id) {
			t.Fatalf("NewSessionID() = %q, not YYYYMMDD_HHMMSS_<8hex>", id)
		}
		if got, want := id[:16], "20260616_143005_"; got != want {
			t.Fatalf("NewSessionID() = %q, want prefix %q (UTC)", id, want)
		}
		if !session.ValidSessionID(id) {
			t.Fatalf("ValidSessionID(%q) = false", id)
		}
		if seen[id] {
			t.Fatalf("NewSessionID() repeated %q", id)
		}
		seen[id] = true
	}
}

func TestValidSessionID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		id   string
		want bool
	}{
		{"20260616_143005_9f86d081", true},
		{"20240229_235959_00000000", true},
		{"", false},
		{"20260616_143005_9F86D081", false},  // upper-case hex
		{"20260616_143005_9f86d08", false},   // short suffix
		{"20260616_143005_9f86d0811", false}, // long suffix
		{"20260616-143005-9f86d081", false},
		{"2026061_1430055_9f86d081", false},
		{"20261316_143005_9f86d081", false}, // month 13
		{"20250229_143005_9f86d081", false}, // not a leap year
		{"20260616_250000_9f86d081", false}, // hour 25
		{"20260616_143005_9f86d08g", false},
		{"../20260616_143005_9f86", false},
		{"20260616_143005_9f86d08\x00", false},
	}
	for _, tt := range tests {
		if got := session.ValidSessionID(tt.id); got != tt.want {
			t.Errorf("ValidSessionID(%q) = %v, want %v", tt.id, got, tt.want)
		}
	}
}
