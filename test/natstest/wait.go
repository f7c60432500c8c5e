package natstest

import (
	"errors"
	"testing"
	"time"
)

const (
	pollMin = 10 * time.Millisecond
	pollMax = 50 * time.Millisecond
)

// WaitFor polls cond until it returns nil and fails the test if that does not
// happen within timeout. The failure message names what was awaited and carries
// the last error cond returned. cond is called at once, then every 10-50 ms.
//
// Use it instead of time.Sleep whenever a test waits for some state. Bound each
// attempt that does I/O with its own short timeout: during a restart or a
// failover a request can be lost, and one attempt must not eat the whole wait.
//
//	natstest.WaitFor(t, 10*time.Second, "publish after failover", func() error {
//		ctx, cancel := context.WithTimeout(ctx, time.Second)
//		defer cancel()
//		_, err := js.Publish(ctx, "events.a", data, jetstream.WithMsgID("a-1"))
//		return err
//	})
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	if err := poll(timeout, cond); err != nil {
		t.Fatalf("natstest: timed out after %v waiting for %s: %v", timeout, what, err)
	}
}

// poll calls cond until it returns nil or timeout passes, and returns the last
// error in the latter case. An error wrapping errFatal ends the polling at once.
func poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	interval := pollMin
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if errors.Is(err, errFatal) || !time.Now().Before(deadline) {
			return err
		}
		timer.Reset(min(interval, time.Until(deadline)))
		<-timer.C
		interval = min(2*interval, pollMax)
	}
}
