//go:build unix

package statedb

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time the process has used (user and system),
// which the load of other processes does not inflate.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
