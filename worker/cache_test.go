package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
)

type closingAgent struct{ closed int }

func (a *closingAgent) Run(context.Context, *agent.Turn, agent.Emitter) (*agent.Result, error) {
	return &agent.Result{}, nil
}
func (a *closingAgent) Close() error { a.closed++; return nil }

func TestAgentCacheLRUAndIdleSweep(t *testing.T) {
	c := newAgentCache(3, time.Hour)
	agents := map[string]*closingAgent{}
	put := func(key, sid string) {
		a := &closingAgent{}
		agents[key+"/"+sid] = a
		c.put(&cacheEntry{key: cacheKey(key, sid), agent: a, tx: newTxState(sid, nil, 0)})
	}
	put("k1", "s1")
	put("k2", "s2")
	put("k3", "s3")
	// Touch k1 so that k2 is the least recently used.
	if e := c.take("k1", "s1"); e == nil {
		t.Fatal("k1 missing")
	} else {
		c.put(e)
	}
	put("k4", "s4")
	if got, want := c.len(), 3; got != want {
		t.Fatalf("len %d, want %d", got, want)
	}
	if agents["k2/s2"].closed != 1 {
		t.Fatalf("the LRU entry was not closed on eviction: %d", agents["k2/s2"].closed)
	}
	if c.take("k2", "s2") != nil {
		t.Fatal("evicted entry still cached")
	}
	for _, k := range []string{"k1/s1", "k3/s3", "k4/s4"} {
		if agents[k].closed != 0 {
			t.Fatalf("%s closed while cached", k)
		}
	}
	// Eviction by session key (the broadcast on finalize) drops every
	// session id of that key.
	put("k1", "s9")
	c.evictSession("k1")
	if c.take("k1", "s1") != nil || c.take("k1", "s9") != nil {
		t.Fatal("evictSession left entries of k1")
	}
	if agents["k1/s9"].closed != 1 {
		t.Fatal("evictSession did not close")
	}
	// Idle sweep: nothing is idle now; an hour later everything is.
	if n := c.sweep(time.Now()); n != 0 {
		t.Fatalf("swept %d fresh entries", n)
	}
	before := c.len()
	if n := c.sweep(time.Now().Add(2 * time.Hour)); n != before || c.len() != 0 {
		t.Fatalf("idle sweep evicted %d of %d, left %d", n, before, c.len())
	}
	if hits, misses := c.hits, c.misses; hits == 0 || misses == 0 {
		t.Fatalf("hits %d misses %d", hits, misses)
	}
}

func TestAgentCacheBounded(t *testing.T) {
	c := newAgentCache(128, time.Hour)
	for i := 0; i < 1000; i++ {
		c.put(&cacheEntry{key: cacheKey(fmt.Sprint("k", i), "s"), agent: &closingAgent{}, tx: newTxState("s", nil, 0)})
	}
	if got := c.len(); got != 128 {
		t.Fatalf("cache holds %d entries, want the bound 128", got)
	}
}
