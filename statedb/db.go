package statedb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Write-contention settings, as the storage design fixes them: a short
// SQLite busy timeout, then an application retry with random jitter so that
// competing writers do not retry in lock step (the convoy effect of
// SQLite's own deterministic backoff), and a passive WAL checkpoint every
// CheckpointEvery successful writes.
const (
	BusyTimeout     = time.Second
	WriteMaxRetries = 15
	WriteRetryMin   = 20 * time.Millisecond
	WriteRetryMax   = 150 * time.Millisecond
	CheckpointEvery = 50
)

// cacheKiB is the page cache of each connection, in KiB.
const cacheKiB = 64 << 10

// readMmapBytes is the memory map of each read connection (SQLite's
// mmap_size; this build of SQLite caps it at about 2 GiB).
const readMmapBytes = 2 << 30

// Options configure Open. A nil *Options is the zero value.
type Options struct {
	// ReadOnly opens the file for inspection only: no migration, no write.
	// It works while another process writes (WAL). Defaults to false.
	ReadOnly bool
	// Logger receives warnings. Defaults to a discard logger.
	Logger *slog.Logger
	// Readers is the size of the read connection pool. Defaults to 4.
	Readers int

	// noMmap leaves the read connections without a memory map (benchmarks
	// compare the two).
	noMmap bool
}

// DB is a session database: the storage schema at SchemaVersion in one
// SQLite file in WAL mode. It is safe for concurrent use; writes go through
// one connection, reads through a small pool, and several processes may
// open the same file.
type DB struct {
	path     string
	readOnly bool
	w        *sql.DB // the write connection (nil when read-only)
	r        *sql.DB // the read pool
	log      *slog.Logger

	mu     sync.Mutex
	writes int // successful writes since the last checkpoint

	closeOnce sync.Once
	closeErr  error
}

func dsn(path string, readOnly bool, mmap int64) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", BusyTimeout.Milliseconds()))
	// A 64 MiB page cache per connection (SQLite's default is 2 MiB): the
	// two FTS5 indexes touch many pages per inserted row and per query, and
	// with the default cache both spend most of their time re-reading them.
	q.Add("_pragma", fmt.Sprintf("cache_size(%d)", -cacheKiB))
	// Read connections map the file (mmap_size): a page is read from the
	// mapping instead of copied into the connection's cache by a read
	// system call, which for a search (a thousand candidate rows spread
	// over the file) was a large part of its CPU time.
	if mmap > 0 {
		q.Add("_pragma", fmt.Sprintf("mmap_size(%d)", mmap))
	}
	if readOnly {
		q.Add("mode", "ro")
		q.Add("_pragma", "query_only(1)")
	} else {
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "synchronous(NORMAL)")
		q.Add("_txlock", "immediate")
	}
	return "file:" + path + "?" + q.Encode()
}

// Open opens (creating it when absent, unless read-only) the database file
// at path and migrates it to SchemaVersion.
func Open(ctx context.Context, path string, opts *Options) (*DB, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Readers <= 0 {
		o.Readers = 4
	}
	if path == "" {
		return nil, errors.New("statedb: empty database path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	db := &DB{path: abs, readOnly: o.ReadOnly, log: o.Logger}
	if o.ReadOnly {
		if _, err := os.Stat(abs); err != nil {
			return nil, fmt.Errorf("statedb: open %s read-only: %w", abs, err)
		}
	} else {
		if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
			return nil, fmt.Errorf("statedb: %w", err)
		}
		db.w, err = sql.Open("sqlite", dsn(abs, false, 0))
		if err != nil {
			return nil, err
		}
		db.w.SetMaxOpenConns(1)
		db.w.SetConnMaxIdleTime(0)
	}
	var mmap int64 = readMmapBytes
	if o.noMmap {
		mmap = 0
	}
	db.r, err = sql.Open("sqlite", dsn(abs, true, mmap))
	if err != nil {
		db.Close()
		return nil, err
	}
	db.r.SetMaxOpenConns(o.Readers)
	if !o.ReadOnly {
		if err := db.migrate(ctx); err != nil {
			db.Close()
			return nil, fmt.Errorf("statedb: migrate %s: %w", abs, err)
		}
	} else {
		var v int
		if err := db.r.QueryRowContext(ctx, `SELECT version FROM schema_version LIMIT 1`).Scan(&v); err != nil {
			db.Close()
			return nil, fmt.Errorf("statedb: %s is not a session database: %w", abs, err)
		}
	}
	return db, nil
}

// Path returns the absolute path of the database file.
func (db *DB) Path() string { return db.path }

// Close closes the database. It is idempotent.
func (db *DB) Close() error {
	db.closeOnce.Do(func() {
		if db.w != nil {
			// A last checkpoint keeps the WAL file small between runs.
			_, _ = db.w.Exec(`PRAGMA wal_checkpoint(PASSIVE)`)
			db.closeErr = db.w.Close()
		}
		if db.r != nil {
			if err := db.r.Close(); err != nil && db.closeErr == nil {
				db.closeErr = err
			}
		}
	})
	return db.closeErr
}

// Version returns the schema version stored in the file.
func (db *DB) Version(ctx context.Context) (int, error) {
	var v int
	err := db.r.QueryRowContext(ctx, `SELECT version FROM schema_version LIMIT 1`).Scan(&v)
	return v, err
}

// isBusy reports whether err is SQLite's "database is locked/busy".
func isBusy(err error) bool {
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return true
		}
	}
	return false
}

// write runs fn in a BEGIN IMMEDIATE transaction, retrying the whole
// transaction with a random 20–150 ms pause while the file is locked by
// another writer, up to WriteMaxRetries times. Every CheckpointEvery
// successful writes it runs a passive WAL checkpoint.
func (db *DB) write(ctx context.Context, fn func(tx *sql.Tx) error) error {
	if db.readOnly {
		return ErrReadOnly
	}
	var last error
	for attempt := 0; attempt <= WriteMaxRetries; attempt++ {
		if attempt > 0 {
			d := WriteRetryMin + rand.N(WriteRetryMax-WriteRetryMin+1)
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
		err := db.tryWrite(ctx, fn)
		if err == nil {
			db.afterWrite(ctx)
			return nil
		}
		if !isBusy(err) {
			return err
		}
		last = err
	}
	return fmt.Errorf("%w after %d attempts: %v", ErrLocked, WriteMaxRetries+1, last)
}

func (db *DB) tryWrite(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := db.w.BeginTx(ctx, nil) // BEGIN IMMEDIATE (_txlock=immediate)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (db *DB) afterWrite(ctx context.Context) {
	db.mu.Lock()
	db.writes++
	due := db.writes >= CheckpointEvery
	if due {
		db.writes = 0
	}
	db.mu.Unlock()
	if due {
		if _, err := db.w.ExecContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`); err != nil {
			db.log.Debug("wal checkpoint", slog.Any("error", err))
		}
	}
}
