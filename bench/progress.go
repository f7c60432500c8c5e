package bench

import (
	"sync"
	"time"
)

// startProgress calls o.Progress with what snap returns, about every
// o.ProgressEvery, until the returned function is called (which waits for
// the reporter to stop). Without o.Progress it does nothing.
func startProgress(o Options, snap func() Progress) func() {
	if o.Progress == nil {
		return func() {}
	}
	every := o.ProgressEvery
	if every <= 0 {
		every = time.Second
	}
	begin := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				p := snap()
				p.Elapsed = time.Since(begin)
				o.Progress(p)
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(stop); wg.Wait() }) }
}
