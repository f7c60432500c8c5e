package worker

import (
	"context"
	"sync"
	"time"
)

// turnGate bounds the agent runs of one worker and lets a turn on its last
// allowed attempt run alone.
//
// A worker process that dies takes every turn it was running with it, and
// each of them counts one interrupted attempt. A turn whose next
// interruption would dead-letter it should not share its process with any
// other turn: otherwise a neighbour's poison message could dead-letter an
// innocent conversation. Such a turn asks for the whole gate: while it
// waits, no new turn starts (so a steady stream of ordinary turns cannot
// starve it) and the running ones end; then it runs alone. The wait is
// bounded: agent turns can run for minutes, and a worker must not stop
// starting turns for that long, so past the bound the turn takes an
// ordinary slot and runs beside the others.
type turnGate struct {
	mu        sync.Mutex
	max       int
	running   int  // shared holders
	alone     bool // an exclusive holder runs
	waiting   int  // exclusive waiters
	changed   chan struct{}
	exclusive int // exclusive acquisitions so far, for tests and stats
}

func newTurnGate(max int) *turnGate {
	return &turnGate{max: max, changed: make(chan struct{})}
}

// acquire takes a slot, or returns false when ctx ended first.
func (g *turnGate) acquire(ctx context.Context) (func(), bool) {
	g.mu.Lock()
	for {
		if !g.alone && g.waiting == 0 && g.running < g.max {
			g.running++
			g.mu.Unlock()
			return g.releaseFunc(false), true
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
			g.mu.Lock()
		case <-ctx.Done():
			return nil, false
		}
	}
}

// acquireAlone takes the whole gate, waiting up to within for the running
// turns to end; past that it takes an ordinary slot instead. alone reports
// which; ok is false when ctx ended first.
func (g *turnGate) acquireAlone(ctx context.Context, within time.Duration) (release func(), alone, ok bool) {
	bound := time.NewTimer(within)
	defer bound.Stop()
	g.mu.Lock()
	g.waiting++
	for {
		if !g.alone && g.running == 0 {
			g.waiting--
			g.alone = true
			g.exclusive++
			g.mu.Unlock()
			return g.releaseFunc(true), true, true
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
			g.mu.Lock()
			continue
		case <-bound.C:
		case <-ctx.Done():
		}
		g.mu.Lock()
		g.waiting--
		g.broadcastLocked()
		g.mu.Unlock()
		if ctx.Err() != nil {
			return nil, false, false
		}
		release, ok = g.acquire(ctx)
		return release, false, ok
	}
}

func (g *turnGate) releaseFunc(alone bool) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			if alone {
				g.alone = false
			} else {
				g.running--
			}
			g.broadcastLocked()
			g.mu.Unlock()
		})
	}
}

func (g *turnGate) broadcastLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// inUse is how many turns run now.
func (g *turnGate) inUse() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.alone {
		return 1
	}
	return g.running
}

// exclusives is how many turns ran alone so far.
func (g *turnGate) exclusives() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.exclusive
}
