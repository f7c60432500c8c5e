package statedb

import "errors"

var (
	// ErrNotFound is returned for a session id or title that is not stored.
	ErrNotFound = errors.New("statedb: not found")
	// ErrTitleTaken is returned by SetSessionTitle when another session has
	// the title (titles are unique among non-NULL titles).
	ErrTitleTaken = errors.New("statedb: title already in use")
	// ErrReadOnly is returned by writes on a database opened read-only.
	ErrReadOnly = errors.New("statedb: database opened read-only")
	// ErrLocked is returned when a write found the file locked by other
	// writers through every retry.
	ErrLocked = errors.New("statedb: database locked")
	// ErrSchemaTooNew is returned by Open for a file written by a newer build.
	ErrSchemaTooNew = errors.New("statedb: schema version newer than this build")
	// ErrInvalid is returned for bad arguments (an empty id, a bad role).
	ErrInvalid = errors.New("statedb: invalid argument")
)
