package ingress

import (
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// RuneLen is the length of s in characters (Unicode code points).
func RuneLen(s string) int { return utf8.RuneCountInString(s) }

// UTF16Len is the length of s in UTF-16 code units, the unit in which
// Telegram counts its message limit (an emoji outside the BMP counts 2).
func UTF16Len(s string) int {
	n := 0
	for _, r := range s {
		n += utf16.RuneLen(r)
	}
	return n
}

const fence = "```"

// Split cuts text into chunks of at most limit units as measured by length
// (RuneLen or UTF16Len), in order, so that concatenated they read as the
// original. It cuts at line ends when it can, else at a space, else inside
// a word. A fenced code block (```) that has to be cut is closed at the end
// of one chunk and reopened, with its info string, at the start of the
// next, so every chunk renders as valid Markdown. Empty text gives no
// chunks. limit must leave room for a fence opener and closer (at least 16).
func Split(text string, limit int, length func(string) int) []string {
	if limit < 16 {
		limit = 16
	}
	if length(text) <= limit {
		if strings.TrimSpace(text) == "" {
			return nil
		}
		return []string{text}
	}
	sp := splitter{limit: limit, length: length}
	lines := strings.Split(text, "\n")
	for _, line := range lines {
		sp.addLine(line)
	}
	sp.flush()
	return sp.chunks
}

type splitter struct {
	limit  int
	length func(string) int
	chunks []string
	cur    []string // lines of the current chunk
	// open is the opening line of the fenced block the text is inside, ""
	// outside any.
	open string
	// body reports whether cur holds more than a reopened fence line.
	body bool
}

// closer is what ends a chunk cut inside a fence.
const closer = "\n" + fence

func (s *splitter) size(lines []string) int {
	n := 0
	for i, l := range lines {
		if i > 0 {
			n++ // the newline
		}
		n += s.length(l)
	}
	return n
}

// fits reports whether cur plus line (and a closer, when the fence is
// still open after line) stays within the limit.
func (s *splitter) fits(line string, openAfter bool) bool {
	n := s.size(append(s.cur[:len(s.cur):len(s.cur)], line))
	if openAfter {
		n += s.length(closer)
	}
	return n <= s.limit
}

func (s *splitter) addLine(line string) {
	toggles := strings.HasPrefix(strings.TrimLeftFunc(line, unicode.IsSpace), fence)
	if toggles && s.open == "" && s.length(line) > s.limit/4 {
		// An opener too long to repeat in every chunk: plain text.
		toggles = false
	}
	openAfter := s.open != ""
	if toggles {
		openAfter = !openAfter
	}
	for {
		if s.fits(line, openAfter) {
			s.cur = append(s.cur, line)
			s.body = true
			break
		}
		if s.body {
			// Start a new chunk and try again there.
			s.cut()
			continue
		}
		// The line alone does not fit an empty chunk: cut it.
		room := s.limit - s.size(s.cur)
		if len(s.cur) > 0 {
			room-- // the newline
		}
		if s.open != "" {
			room -= s.length(closer)
		}
		if line == "" {
			// Nothing to cut (only the reopened fence is there): keep it.
			s.cur = append(s.cur, line)
			s.body = true
			break
		}
		head, rest := cutLine(line, room, s.length)
		s.cur = append(s.cur, head)
		s.body = true
		s.cut()
		line = rest
	}
	if toggles {
		if s.open == "" {
			s.open = strings.TrimSpace(line)
		} else {
			s.open = ""
		}
	}
}

// cut ends the current chunk (closing an open fence) and starts the next
// (reopening it).
func (s *splitter) cut() {
	chunk := strings.Join(s.cur, "\n")
	if s.open != "" {
		chunk += closer
	}
	if strings.TrimSpace(chunk) != "" {
		s.chunks = append(s.chunks, chunk)
	}
	s.cur = s.cur[:0]
	s.body = false
	if s.open != "" {
		s.cur = append(s.cur, s.open)
	}
}

func (s *splitter) flush() {
	if !s.body {
		return
	}
	chunk := strings.Join(s.cur, "\n")
	if strings.TrimSpace(chunk) != "" {
		s.chunks = append(s.chunks, chunk)
	}
}

// cutLine splits line into a head of at most room units, cut after the last
// space when there is one in its second half, and the rest. The head holds
// at least one character.
func cutLine(line string, room int, length func(string) int) (head, rest string) {
	if room < 1 {
		room = 1
	}
	end, used := 0, 0
	for i := 0; i < len(line); {
		_, size := utf8.DecodeRuneInString(line[i:])
		w := length(line[i : i+size])
		if used+w > room && end > 0 {
			break
		}
		used += w
		i += size
		end = i
	}
	if sp := strings.LastIndexByte(line[:end], ' '); sp > end/2 {
		end = sp + 1
	}
	return line[:end], line[end:]
}
