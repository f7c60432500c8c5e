package bench

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/broker"
)

// tap counts, by kind, every message the server routes in the account while
// it is on. It is a wildcard subscription on its own connection, so it sees
// one copy of each publish, request, response and consumer delivery.
type tap struct {
	names  broker.Names
	on     atomic.Bool
	mu     sync.Mutex
	counts map[string]int64
	sub    *nats.Subscription
}

func startTap(nc *nats.Conn, names broker.Names) (*tap, error) {
	t := &tap{names: names, counts: map[string]int64{}}
	sub, err := nc.Subscribe(">", t.onMsg)
	if err != nil {
		return nil, fmt.Errorf("bench: tap: %w", err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	t.sub = sub
	return t, nc.Flush()
}

func (t *tap) onMsg(m *nats.Msg) {
	if !t.on.Load() {
		return
	}
	k := t.classify(m)
	t.mu.Lock()
	t.counts[k]++
	t.mu.Unlock()
}

// classify names the kind of a message without its lane, session or inbox
// tokens.
func (t *tap) classify(m *nats.Msg) string {
	s := m.Subject
	p := t.names.Prefix() + "."
	tok := strings.Split(s, ".")
	if strings.HasPrefix(m.Reply, "$JS.ACK.") {
		// A consumer delivery: pull deliveries keep the stored subject.
		at := strings.Split(m.Reply, ".")
		if len(at) > 3 {
			return "deliver " + at[2] + "/" + at[3]
		}
		return "deliver"
	}
	switch {
	case strings.HasPrefix(s, "_INBOX."):
		switch {
		case m.Header.Get("Nats-Sequence") != "" || m.Header.Get("Nats-Stream") != "":
			if st := m.Header.Get("Nats-Stream"); st != "" {
				return "response: direct get " + st
			}
			return "response: direct get"
		case bytes.HasPrefix(m.Data, []byte(`{"stream"`)):
			if bytes.Contains(m.Data, []byte(`"duplicate":true`)) {
				return "response: puback (duplicate)"
			}
			return "response: puback"
		case bytes.Contains(m.Data, []byte(`"error"`)):
			if i := bytes.Index(m.Data, []byte(`"err_code":`)); i >= 0 {
				end := i + len(`"err_code":`)
				j := end
				for j < len(m.Data) && m.Data[j] >= '0' && m.Data[j] <= '9' {
					j++
				}
				return "response: error " + string(m.Data[end:j])
			}
			return "response: error"
		case len(m.Data) == 0 && m.Header.Get("Status") != "":
			return "response: status " + m.Header.Get("Status")
		default:
			return "response: other"
		}
	case strings.HasPrefix(s, "$JS.ACK."):
		kind := "ack"
		switch {
		case bytes.HasPrefix(m.Data, []byte("-NAK")):
			kind = "nak"
		case bytes.HasPrefix(m.Data, []byte("+WPI")):
			kind = "in progress"
		case bytes.HasPrefix(m.Data, []byte("+TERM")):
			kind = "term"
		case bytes.HasPrefix(m.Data, []byte("+ACK")) && m.Reply != "":
			kind = "double ack"
		}
		if len(tok) > 3 {
			return kind + " " + tok[2] + "/" + tok[3]
		}
		return kind
	case strings.HasPrefix(s, "$JS.API.DIRECT.GET."):
		if len(tok) > 4 {
			return "direct get " + tok[4]
		}
		return "direct get"
	case strings.HasPrefix(s, "$JS.API.CONSUMER.MSG.NEXT."):
		return "pull request " + strings.Join(tok[5:], "/")
	case strings.HasPrefix(s, "$JS.API."):
		n := min(len(tok), 4)
		return "api " + strings.Join(tok[2:n], ".")
	case strings.HasPrefix(s, "$JS.EVENT."):
		return "advisory (sent because the tap listens)"
	case strings.HasPrefix(s, "$KV."):
		kind := "kv write "
		if m.Header.Get("Nats-Expected-Last-Subject-Sequence") != "" {
			kind = "kv cas write "
		}
		if m.Header.Get("Nats-TTL") != "" {
			kind = "kv write with ttl "
		}
		return kind + tok[1]
	case strings.HasPrefix(s, p+"in."):
		return "publish inbox"
	case strings.HasPrefix(s, p+"tx."):
		return "append transcript"
	case strings.HasPrefix(s, p+"out."):
		return "publish outbox"
	case strings.HasPrefix(s, p+"box."):
		return "publish mailbox"
	case strings.HasPrefix(s, p+"ev."):
		return "publish event " + tok[2]
	}
	if len(tok) > 2 {
		return strings.Join(tok[:2], ".") + ".*"
	}
	return s
}

func (t *tap) perTurn(turns float64) map[string]float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]float64, len(t.counts))
	for k, v := range t.counts {
		out[k] = float64(v) / turns
	}
	return out
}

// FormatOps renders OpsPerTurn sorted by count, one kind per line.
func FormatOps(ops map[string]float64) string {
	keys := make([]string, 0, len(ops))
	for k := range ops {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if ops[keys[i]] != ops[keys[j]] {
			return ops[keys[i]] > ops[keys[j]]
		}
		return keys[i] < keys[j]
	})
	var b strings.Builder
	total := 0.0
	for _, k := range keys {
		total += ops[k]
		fmt.Fprintf(&b, "%8.2f  %s\n", ops[k], k)
	}
	fmt.Fprintf(&b, "%8.2f  total\n", total)
	return b.String()
}
