package statedb

import "context"

// SetTestHookInBatch installs a function that runs inside every indexer
// batch transaction (helper processes of the crash test use it).
func SetTestHookInBatch(f func()) { testHookInBatch = f }

// FTSSegments returns the number of segments on each level of an FTS
// table's index.
func FTSSegments(db *DB, table string) ([]int, error) {
	return db.ftsSegments(context.Background(), table)
}
