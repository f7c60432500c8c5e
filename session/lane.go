package session

import (
	"fmt"
	"hash/fnv"
	"io"
	"strings"
)

// NumPartitions is the fixed number of inbox partitions a lane maps to. It
// never changes: the partition is part of the lane's inbox subject.
const NumPartitions = 64

const upperHex = "0123456789ABCDEF"

// laneSafe reports whether c stands for itself in a lane token.
func laneSafe(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'
}

// LaneToken writes a session key as NATS subject tokens: the key is split on
// ':', each segment is escaped so it holds only [A-Za-z0-9_-] (every other
// byte, '=' included, becomes '=' and two upper-case hex digits; an empty
// segment becomes a lone '='), and the segments are joined with '.'.
//
// The token is never empty, every segment is a valid subject token, the
// whole token is a valid KV key, and ParseLaneToken reverses it:
//
//	agent:main:telegram:group:-100123:u42 → agent.main.telegram.group.-100123.u42
//	agent:main:whatsapp:dm:a@b.c           → agent.main.whatsapp.dm.a=40b=2Ec
func LaneToken(sessionKey string) string {
	var b strings.Builder
	b.Grow(len(sessionKey) + len(sessionKey)/4 + 1)
	start := 0
	for i := 0; i <= len(sessionKey); i++ {
		if i < len(sessionKey) && sessionKey[i] != ':' {
			continue
		}
		if start > 0 {
			b.WriteByte('.')
		}
		seg := sessionKey[start:i]
		if seg == "" {
			b.WriteByte('=')
		}
		for j := 0; j < len(seg); j++ {
			c := seg[j]
			if laneSafe(c) {
				b.WriteByte(c)
				continue
			}
			b.WriteByte('=')
			b.WriteByte(upperHex[c>>4])
			b.WriteByte(upperHex[c&0x0f])
		}
		start = i + 1
	}
	return b.String()
}

// ParseLaneToken returns the session key tok stands for. It accepts exactly
// the strings LaneToken produces (so ParseLaneToken(tok) succeeds only when
// LaneToken of the result is tok again) and otherwise returns an error
// wrapping ErrInvalidLaneToken.
func ParseLaneToken(tok string) (string, error) {
	if tok == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidLaneToken)
	}
	var b strings.Builder
	b.Grow(len(tok))
	for n, seg := range strings.Split(tok, ".") {
		if n > 0 {
			b.WriteByte(':')
		}
		switch seg {
		case "":
			return "", fmt.Errorf("%w %q: segment %d is empty", ErrInvalidLaneToken, tok, n)
		case "=":
			continue // an empty key segment
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if laneSafe(c) {
				b.WriteByte(c)
				continue
			}
			if c != '=' {
				return "", fmt.Errorf("%w %q: byte %q is not allowed", ErrInvalidLaneToken, tok, c)
			}
			if i+2 >= len(seg) {
				return "", fmt.Errorf("%w %q: truncated escape in segment %d", ErrInvalidLaneToken, tok, n)
			}
			hi, lo := unhexUpper(seg[i+1]), unhexUpper(seg[i+2])
			if hi < 0 || lo < 0 {
				return "", fmt.Errorf("%w %q: escape %q is not '=' and two upper-case hex digits", ErrInvalidLaneToken, tok, seg[i:i+3])
			}
			v := byte(hi<<4 | lo)
			if laneSafe(v) {
				return "", fmt.Errorf("%w %q: escape %q encodes %q, which is written as itself", ErrInvalidLaneToken, tok, seg[i:i+3], v)
			}
			b.WriteByte(v)
			i += 2
		}
	}
	return b.String(), nil
}

func unhexUpper(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// Partition returns the inbox partition, 0..NumPartitions-1, of a lane: the
// FNV-1a 32-bit hash of the bytes "<prefix>.in.<lane>" modulo NumPartitions.
// That is what the server's partition(64) subject transform hashes for the
// subject <prefix>.in.<lane>, so the assignment can move into the server.
func Partition(prefix, lane string) int {
	h := fnv.New32a()
	_, _ = io.WriteString(h, prefix)
	_, _ = io.WriteString(h, ".in.")
	_, _ = io.WriteString(h, lane)
	return int(h.Sum32() % NumPartitions)
}
