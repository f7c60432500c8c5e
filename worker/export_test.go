package worker

import (
	"time"

	"github.com/nats-io/nats.go"
)

// SetInboxCheck sets the inbox streams' identity check of a worker made
// with c: its average periods while the worker follows the streams'
// advisories (live) and while it does not (poll), and with advisories
// false, it does not follow them.
func SetInboxCheck(c *Config, live, poll time.Duration, advisories bool) {
	c.inboxCheck = inboxCheckConfig{live: live, poll: poll, noAdvisories: !advisories}
}

// InboxIDOf is the identity of inbox stream name as w knows it ("" when
// its set does not name the stream), and whether w knows it stale.
func InboxIDOf(w *Worker, name string) (id string, stale bool) {
	in := w.inboxes.ByName(name)
	if in == nil {
		return "", false
	}
	return in.ID, in.Stale()
}

// ConnOf is w's connection to NATS.
func ConnOf(w *Worker) *nats.Conn { return w.nc }
