package ingress

import "encoding/json"

// The fast path of POST /v1/messages: most bodies are one flat object of
// string fields. decodeFlatMessage reads such a body in one pass without
// reflection; anything else (a nested object, a number, null, a name
// written with an escape, a syntax error, ...) is left to the strict
// decoder (decodeMessageBody), which also words every error. It accepts a
// body only where the strict decoder accepts it and reads the same values,
// so the fast path changes no answer.

// flatField is the string member of r named name, exactly as its JSON tag,
// and its bit in a set of seen members; nil for any other name.
func flatField(r *messageRequest, name string) (*string, uint16) {
	switch name {
	case "platform":
		return &r.Platform, 1 << 0
	case "chat_id":
		return &r.ChatID, 1 << 1
	case "chat_type":
		return &r.ChatType, 1 << 2
	case "user_id":
		return &r.UserID, 1 << 3
	case "user_id_alt":
		return &r.UserIDAlt, 1 << 4
	case "user_name":
		return &r.UserName, 1 << 5
	case "thread_id":
		return &r.ThreadID, 1 << 6
	case "chat_name":
		return &r.ChatName, 1 << 7
	case "message_id":
		return &r.MessageID, 1 << 8
	case "text":
		return &r.Text, 1 << 9
	case "media_group":
		return &r.MediaGroup, 1 << 10
	}
	return nil, 0
}

// decodeFlatMessage decodes body, already known to be valid UTF-8, when it
// is one JSON object whose members are distinct string fields of
// messageRequest named exactly, followed by nothing but white space. ok is
// false for anything else.
func decodeFlatMessage(body []byte) (req *messageRequest, ok bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, false
	}
	// One string holds every value without escapes; the fields slice it.
	all := string(body)
	req = &messageRequest{}
	var seen uint16
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		i++
	} else {
		for {
			ns, ne, esc, next := scanString(body, i)
			if next < 0 || esc {
				return nil, false
			}
			field, bit := flatField(req, all[ns:ne])
			if field == nil || seen&bit != 0 {
				return nil, false
			}
			seen |= bit
			i = skipSpace(body, next)
			if i >= len(body) || body[i] != ':' {
				return nil, false
			}
			i = skipSpace(body, i+1)
			vs, ve, esc, next := scanString(body, i)
			if next < 0 {
				return nil, false
			}
			if esc {
				// encoding/json reads the escapes, exactly as the strict
				// decoder would.
				if err := json.Unmarshal(body[i:next], field); err != nil {
					return nil, false
				}
			} else {
				*field = all[vs:ve]
			}
			i = skipSpace(body, next)
			if i >= len(body) {
				return nil, false
			}
			if body[i] == '}' {
				i++
				break
			}
			if body[i] != ',' {
				return nil, false
			}
			i = skipSpace(body, i+1)
		}
	}
	if skipSpace(body, i) != len(body) {
		return nil, false
	}
	return req, true
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// scanString reads the JSON string that starts at b[i]: its contents are
// b[start:end], esc says whether they hold a backslash escape, and next is
// the index after the closing quote (-1 when b[i] starts no well-formed
// string: a control character, a bad escape or no closing quote).
func scanString(b []byte, i int) (start, end int, esc bool, next int) {
	if i >= len(b) || b[i] != '"' {
		return 0, 0, false, -1
	}
	start = i + 1
	for j := start; j < len(b); j++ {
		c := b[j]
		switch {
		case c == '"':
			return start, j, esc, j + 1
		case c < 0x20:
			return 0, 0, false, -1
		case c == '\\':
			esc = true
			if j+1 >= len(b) {
				return 0, 0, false, -1
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j++
			case 'u':
				if j+5 >= len(b) || !isHex(b[j+2]) || !isHex(b[j+3]) || !isHex(b[j+4]) || !isHex(b[j+5]) {
					return 0, 0, false, -1
				}
				j += 5
			default:
				return 0, 0, false, -1
			}
		}
	}
	return 0, 0, false, -1
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
