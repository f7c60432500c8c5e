package session

import (
	"crypto/rand"
	"encoding/hex"
	"time"
)

// sessionIDTimeLayout is the time part of a session id, always in UTC.
const sessionIDTimeLayout = "20060102_150405"

// sessionIDLength is len("YYYYMMDD_HHMMSS_") + 8 hex digits.
const sessionIDLength = len(sessionIDTimeLayout) + 1 + 8

// NewSessionID returns a new session id for a session created at now, in the
// form YYYYMMDD_HHMMSS_<8 lowercase hex> with the time in UTC and the suffix
// from crypto/rand, e.g. 20260616_143005_9f86d081.
func NewSessionID(now time.Time) string {
	var suffix [4]byte
	_, _ = rand.Read(suffix[:]) // never fails (crypto/rand, Go 1.24+)
	b := make([]byte, 0, sessionIDLength)
	b = now.UTC().AppendFormat(b, sessionIDTimeLayout)
	b = append(b, '_')
	b = hex.AppendEncode(b, suffix[:])
	return string(b)
}

// ValidSessionID reports whether s has the form NewSessionID produces: a real
// date and time YYYYMMDD_HHMMSS, '_', then exactly 8 lowercase hex digits.
// A valid id is safe as a file name and as a subject token.
func ValidSessionID(s string) bool {
	if len(s) != sessionIDLength {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == 8 || i == 15:
			if c != '_' {
				return false
			}
		case i < 15:
			if c < '0' || c > '9' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	_, err := time.Parse(sessionIDTimeLayout, s[:len(sessionIDTimeLayout)])
	return err == nil
}
