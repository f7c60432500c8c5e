package bench

import "syscall"

// childAttr makes the kernel SIGKILL a worker process when the bench dies,
// so no run leaves orphans.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
