package worker

import (
	"container/list"
	"context"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/telemetry"
	"github.com/agentfleet/agentfleet/transcript"
)

// txState is a loaded transcript: its entries, its tail and the entry ids it
// holds. It is owned by one lane goroutine at a time.
type txState struct {
	sessionID string
	entries   []transcript.Entry
	last      uint64
	ids       map[string]bool
	userSeqs  map[userKey]bool
	// hist is historyOf(transcript.Effective(entries)), the agent's
	// history, kept up to date by add (the effective entries themselves
	// are computed when asked for: see history).
	hist []agent.Message
}

// userKey names the inbox message a user entry came from: its stream's
// identity and its seq there.
type userKey struct {
	inbox string
	seq   uint64
}

// hasUser reports whether the transcript holds the user entry of the
// message at seq of inbox stream in. Entries written before they carried
// their stream's identity came from stream 0, the only one there was.
func (t *txState) hasUser(in *broker.Inbox, seq uint64) bool {
	return t.userSeqs[userKey{in.ID, seq}] || (in.Index == 0 && t.userSeqs[userKey{"", seq}])
}

func newTxState(sid string, entries []transcript.Entry, last uint64) *txState {
	st := &txState{sessionID: sid, last: last, ids: make(map[string]bool, len(entries)), userSeqs: map[userKey]bool{}}
	for i := range entries {
		st.add(&entries[i])
	}
	return st
}

func (t *txState) add(e *transcript.Entry) {
	t.entries = append(t.entries, *e)
	if e.Seq > t.last {
		t.last = e.Seq
	}
	if e.ID != "" {
		t.ids[e.ID] = true
	}
	if e.Kind == transcript.KindMessage && e.Role == "user" && e.InboxSeq > 0 {
		t.userSeqs[userKey{e.InboxID, e.InboxSeq}] = true
	}
	if e.Kind == transcript.KindRewind {
		// Rewinds change what is effective; reapply on the whole log.
		for i := range t.entries {
			for _, s := range e.Rewound {
				if t.entries[i].Seq == s {
					t.entries[i].Deleted = true
				}
			}
		}
		t.hist = historyOf(transcript.Effective(t.entries))
		return
	}
	if e.Kind == transcript.KindMessage && !e.Deleted {
		switch e.Role {
		case transcript.RoleUser, transcript.RoleAssistant, transcript.RoleTool, transcript.RoleSystem:
			t.hist = append(t.hist, messageOf(*e))
		}
	}
}

// history is the effective transcript, transcript.Effective(entries): a
// rewind only deletes entries before it, so this is what add kept in hist,
// entry for entry. Built when asked for (a narrowed retry), not per append.
func (t *txState) history() []transcript.Entry {
	return transcript.Effective(t.entries)
}

// lastRole is the role of the last effective entry, "" when none.
func (t *txState) lastRole() string {
	if len(t.hist) == 0 {
		return ""
	}
	return t.hist[len(t.hist)-1].Role
}

// agentHistory is historyOf(history()), shared read-only: its capacity is
// clipped so that later appends never show through.
func (t *txState) agentHistory() []agent.Message {
	if t.hist == nil {
		return []agent.Message{} // as historyOf gives: never nil
	}
	return t.hist[:len(t.hist):len(t.hist)]
}

// cacheEntry is what the agent cache keeps per (session key, session id).
type cacheEntry struct {
	key   string
	agent agent.Agent
	tx    *txState
	used  time.Time
	elem  *list.Element
}

// agentCache is an LRU of agents and their loaded transcripts, bounded in
// size and idle time, as the seed's agent cache.
type agentCache struct {
	mu      sync.Mutex
	max     int
	idleTTL time.Duration
	items   map[string]*cacheEntry
	order   *list.List // front = most recent
	hits    int64
	misses  int64
	metrics *telemetry.Metrics
}

func newAgentCache(max int, idle time.Duration) *agentCache {
	return &agentCache{max: max, idleTTL: idle, items: map[string]*cacheEntry{}, order: list.New()}
}

func cacheKey(sessionKey, sessionID string) string { return sessionKey + "\x00" + sessionID }

// take removes and returns the entry for exclusive use by a lane.
func (c *agentCache) take(sessionKey, sessionID string) *cacheEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := cacheKey(sessionKey, sessionID)
	e := c.items[k]
	c.metrics.CacheLookup(context.Background(), e != nil)
	if e == nil {
		c.misses++
		return nil
	}
	c.hits++
	c.order.Remove(e.elem)
	delete(c.items, k)
	return e
}

// put returns an entry to the cache, evicting the least recently used.
func (c *agentCache) put(e *cacheEntry) {
	var evicted []*cacheEntry
	c.mu.Lock()
	e.used = time.Now()
	if old := c.items[e.key]; old != nil {
		c.order.Remove(old.elem)
		if old.agent != e.agent {
			evicted = append(evicted, old)
		}
	}
	e.elem = c.order.PushFront(e)
	c.items[e.key] = e
	for c.order.Len() > c.max {
		back := c.order.Back()
		victim := back.Value.(*cacheEntry)
		c.order.Remove(back)
		delete(c.items, victim.key)
		evicted = append(evicted, victim)
	}
	c.mu.Unlock()
	c.metrics.CacheEvicted(context.Background(), len(evicted))
	for _, v := range evicted {
		closeAgent(v.agent)
	}
}

// evictSession drops every cached agent of a session key (any session id).
func (c *agentCache) evictSession(sessionKey string) {
	var evicted []*cacheEntry
	c.mu.Lock()
	for k, e := range c.items {
		if len(k) > len(sessionKey) && k[:len(sessionKey)] == sessionKey && k[len(sessionKey)] == 0 {
			c.order.Remove(e.elem)
			delete(c.items, k)
			evicted = append(evicted, e)
		}
	}
	c.mu.Unlock()
	c.metrics.CacheEvicted(context.Background(), len(evicted))
	for _, v := range evicted {
		closeAgent(v.agent)
	}
}

// sweep evicts entries idle for longer than the idle TTL.
func (c *agentCache) sweep(now time.Time) int {
	var evicted []*cacheEntry
	c.mu.Lock()
	for el := c.order.Back(); el != nil; {
		e := el.Value.(*cacheEntry)
		prev := el.Prev()
		if now.Sub(e.used) < c.idleTTL {
			break
		}
		c.order.Remove(el)
		delete(c.items, e.key)
		evicted = append(evicted, e)
		el = prev
	}
	c.mu.Unlock()
	c.metrics.CacheEvicted(context.Background(), len(evicted))
	for _, v := range evicted {
		closeAgent(v.agent)
	}
	return len(evicted)
}

func (c *agentCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.items)
}

func (c *agentCache) closeAll() {
	c.mu.Lock()
	items := c.items
	c.items = map[string]*cacheEntry{}
	c.order.Init()
	c.mu.Unlock()
	for _, v := range items {
		closeAgent(v.agent)
	}
}

func closeAgent(a agent.Agent) {
	if a != nil {
		_ = a.Close()
	}
}
