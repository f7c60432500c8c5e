package worker

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// crashPoint exits the process at a named point when AGENTFLEET_CRASH_AT
// names it: the fault injection the crash-point tests use on real
// processes. It is inert unless that variable is set.
func crashPoint(name string) {
	if crashAt != "" && crashAt == name {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

var crashAt = os.Getenv("AGENTFLEET_CRASH_AT")

// pausePoint stops the whole process (SIGSTOP to itself) the first time it
// reaches the point named by AGENTFLEET_PAUSE_AT — right after a write's own
// lease check passed, just before the write goes to the server — so that
// tests can show that the server-side fence, not the worker's self-check,
// refuses the write of a worker that was paused there while another took
// its lane over. Points: "append:<role>" (a transcript append of that role,
// e.g. append:tool), "reply" (a reply publish), "commit" (the commit CAS).
func pausePoint(name string) {
	if pauseAt != "" && pauseAt == name {
		pauseOnce.Do(func() {
			// The stop reaches the other threads of the process a moment
			// later: this goroutine must not go on meanwhile, so it waits
			// for the SIGCONT that resumes the process.
			cont := make(chan os.Signal, 1)
			signal.Notify(cont, syscall.SIGCONT)
			defer signal.Stop(cont)
			_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			<-cont
		})
	}
}

var (
	pauseAt   = os.Getenv("AGENTFLEET_PAUSE_AT")
	pauseOnce sync.Once
)
