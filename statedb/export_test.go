package statedb

// SetTestHookInBatch installs a function that runs inside every indexer
// batch transaction (helper processes of the crash test use it).
func SetTestHookInBatch(f func()) { testHookInBatch = f }
