package main

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// safe renders text that users or platforms chose for the operator's
// terminal: control characters (escape sequences, carriage returns, new
// lines that could forge output lines) and invisible format characters
// (bidi overrides and isolates, which reorder what the terminal shows) are
// written as Go escapes (\n, \x1b, \u202e); invalid UTF-8 as \xff. Anything
// else stands for itself. --json output is never escaped this way.
func safe(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case unsafeRune(r) && r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
		i += size
	}
	return b.String()
}

func needsEscape(s string) bool {
	if !utf8.ValidString(s) {
		return true
	}
	return strings.IndexFunc(s, unsafeRune) >= 0
}

// unsafeRune reports a control character (C0, DEL, C1) or a format
// character (Unicode category Cf: bidi embeddings, overrides and isolates,
// zero-width joiners and marks, the BOM), or a line or paragraph separator.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}

// safeValue is safe for any value printed with %v.
func safeValue(v any) string { return safe(fmt.Sprint(v)) }
