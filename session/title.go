package session

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxTitleLength is the longest session title, in characters, after
// SanitizeTitle's cleanup (seeds/session-storage.md).
const MaxTitleLength = 100

// ErrInvalidTitle is wrapped by every error of SanitizeTitle.
var ErrInvalidTitle = errors.New("invalid session title")

// SanitizeTitle cleans a session title as the storage seed does: control
// characters (NUL included) are dropped, except white space, which is kept
// to be collapsed; invisible format characters (zero-width spaces and
// joiners, bidirectional marks and overrides, the byte order mark, word
// joiners, interlinear annotations and the object replacement character)
// are dropped; every run of white space becomes one space; the ends are
// trimmed. A title that is empty after cleanup, or longer than
// MaxTitleLength characters, is refused with an error wrapping
// ErrInvalidTitle that says why.
func SanitizeTitle(title string) (string, error) {
	var b strings.Builder
	b.Grow(len(title))
	space := false
	for _, r := range title {
		switch {
		case r == utf8.RuneError, invisible(r):
			continue
		case unicode.IsSpace(r):
			space = true
			continue
		case unicode.IsControl(r):
			continue
		}
		if space && b.Len() > 0 {
			b.WriteByte(' ')
		}
		space = false
		b.WriteRune(r)
	}
	out := b.String()
	if out == "" {
		return "", fmt.Errorf("%w: it is empty once control and invisible characters are removed", ErrInvalidTitle)
	}
	if n := utf8.RuneCountInString(out); n > MaxTitleLength {
		return "", fmt.Errorf("%w: it is too long (%d characters, at most %d)", ErrInvalidTitle, n, MaxTitleLength)
	}
	return out, nil
}

// invisible reports whether r is a format character that renders as
// nothing: U+200B..U+200F, U+2028..U+202E, U+2060..U+2069, U+FEFF,
// U+FFF9..U+FFFC, and any other character of category Cf.
func invisible(r rune) bool {
	switch {
	case r >= 0x200B && r <= 0x200F, r >= 0x2028 && r <= 0x202E, r >= 0x2060 && r <= 0x2069,
		r == 0xFEFF, r >= 0xFFF9 && r <= 0xFFFC:
		return true
	}
	return unicode.Is(unicode.Cf, r)
}
