//go:build !unix

package statedb

import "time"

func processCPU() time.Duration { return 0 }
