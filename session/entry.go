package session

import "time"

// SessionEntry is the per-lane record stored in the sessions bucket under the
// lane token. It carries every field and flag of the session lifecycle plus
// the fleet fields of the lane protocol. Its JSON form is snake_case; missing
// fields decode to their zero values and unknown fields are ignored, so an
// older record always loads.
type SessionEntry struct {
	SessionKey  string         `json:"session_key"`
	SessionID   string         `json:"session_id"`
	CreatedAt   time.Time      `json:"created_at"`
	UpdatedAt   time.Time      `json:"updated_at"`
	Origin      *SessionSource `json:"origin,omitempty"`
	DisplayName string         `json:"display_name,omitempty"`
	Platform    Platform       `json:"platform,omitempty"`
	ChatType    string         `json:"chat_type,omitempty"`

	InputTokens      int64   `json:"input_tokens"`
	OutputTokens     int64   `json:"output_tokens"`
	CacheReadTokens  int64   `json:"cache_read_tokens"`
	CacheWriteTokens int64   `json:"cache_write_tokens"`
	TotalTokens      int64   `json:"total_tokens"`
	EstimatedCostUSD float64 `json:"estimated_cost_usd"`
	CostStatus       string  `json:"cost_status,omitempty"`
	LastPromptTokens int64   `json:"last_prompt_tokens"`

	// State-machine flags.
	WasAutoReset       bool       `json:"was_auto_reset"`
	AutoResetReason    string     `json:"auto_reset_reason,omitempty"`
	ResetHadActivity   bool       `json:"reset_had_activity"`
	IsFreshReset       bool       `json:"is_fresh_reset"`
	ExpiryFinalized    bool       `json:"expiry_finalized"`
	Suspended          bool       `json:"suspended"`
	ResumePending      bool       `json:"resume_pending"`
	ResumeReason       string     `json:"resume_reason,omitempty"`
	LastResumeMarkedAt *time.Time `json:"last_resume_marked_at,omitempty"`

	// Fleet fields (lane protocol).

	// Owner is "<worker id>/<incarnation>" of the worker holding the lane's
	// lease, or empty when no worker owns it.
	Owner string `json:"owner,omitempty"`
	// LeaseEpoch is the revision of the lease Create that made Owner the
	// owner; it fences every owner-side write.
	LeaseEpoch uint64 `json:"lease_epoch,omitempty"`
	// InboxID is the identity of the inbox stream CommittedSeq refers to.
	InboxID string `json:"inbox_id,omitempty"`
	// CommittedSeq is the last inbox sequence of this lane whose effects are durable.
	CommittedSeq uint64 `json:"committed_seq,omitempty"`
	// Turn is the intent record of the running turn, nil when idle.
	Turn *TurnIntent `json:"turn,omitempty"`
	// InterruptedTurns counts turns interrupted in a row (crash, drain
	// timeout, lost lease); a completed turn clears it. At 3 the lane is
	// suspended and the turn dead-lettered.
	InterruptedTurns int    `json:"interrupted_turns,omitempty"`
	LastTurnID       string `json:"last_turn_id,omitempty"`
	// BusyMode is interrupt, queue or steer; empty means the configured default.
	BusyMode        string `json:"busy_mode,omitempty"`
	ParentSessionID string `json:"parent_session_id,omitempty"`
	// ExpiryFailures counts failed finalize attempts of the expiry watcher.
	ExpiryFailures int `json:"expiry_failures,omitempty"`
	// QueueDepth is the number of /queue items waiting in the inbox, as last
	// seen by the owner.
	QueueDepth int `json:"queue_depth,omitempty"`
	// RecentSessions are the lane's previous session ids, newest first (at
	// most MaxRecentSessions), for /resume.
	RecentSessions []string `json:"recent_sessions,omitempty"`
	// DiscardedQueue counts /queue items discarded by a /new or /reset that
	// followed them, until that command reports them.
	DiscardedQueue int `json:"discarded_queue,omitempty"`
	// AutoResumedAt is the last_resume_marked_at of the resume_pending
	// marker whose automatic resume turn has been started, so that one
	// marker gets one automatic turn.
	AutoResumedAt *time.Time `json:"auto_resumed_at,omitempty"`
}

// TurnIntent is recorded in the entry (by CAS) before a turn has any side
// effect. Recovery reuses it verbatim: a crash never mints a second session id
// nor sends a second reset notice.
type TurnIntent struct {
	// ID is unique per turn; it is stored as last_turn_id on commit.
	ID string `json:"id"`
	// FirstSeq and LastSeq bound the inbox messages the turn incorporates.
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	// InboxID is the identity of the inbox stream (its fleet_inbox_id) that
	// FirstSeq and LastSeq count in. Empty means the entry's InboxID (a
	// record written before turns named their stream): see
	// SessionEntry.TurnInboxID.
	InboxID string `json:"inbox_id,omitempty"`
	// RetryFrom is the last seq of the range as first recorded, once a retry
	// after an interrupted attempt narrowed the range to its first message
	// (so that a poison message dead-letters alone). The messages up to it
	// belong to the turns that follow; they are not news that interrupts or
	// steers the narrowed retry.
	RetryFrom uint64 `json:"retry_from,omitempty"`
	// Kind is "messages", "queue" or "command".
	Kind string `json:"kind"`
	// Attempt starts at 1 and grows with each interrupted attempt.
	Attempt int `json:"attempt"`
	// AgentStarted is the attempt whose agent run started, recorded just
	// before a resumed attempt (2 and up) runs its agent. A resumed attempt
	// that ended before that (its worker could not write to the store)
	// was not interrupted while running and does not count in
	// interrupted_turns.
	AgentStarted int `json:"agent_started,omitempty"`
	// SessionID is the session the turn writes to (the session decision).
	SessionID string `json:"session_id"`
	// PreviousSessionID is the session the decision switched away from, if any.
	PreviousSessionID string `json:"previous_session_id,omitempty"`
	// ResetReason is why the decision minted a new session: suspended, idle,
	// daily, new, reset; empty when the session was kept.
	ResetReason string `json:"reset_reason,omitempty"`
	// ForkFrom is the session of another lane that a /resume forked into
	// this turn's new session.
	ForkFrom string `json:"fork_from,omitempty"`
	// Notices are the user-facing notices the decision requires (sent once).
	Notices []string `json:"notices,omitempty"`
	// Notes are the system notes the agent receives for this turn.
	Notes []string `json:"notes,omitempty"`
	// Owner and Epoch identify who recorded the intent.
	Owner     string    `json:"owner,omitempty"`
	Epoch     uint64    `json:"epoch,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// TraceParent is the W3C traceparent of the span of the turn's latest
	// attempt, when it was traced: the attempt that resumes an interrupted
	// one links to it, on whichever worker it runs.
	TraceParent string `json:"trace_parent,omitempty"`
}

// TurnInboxID is the identity of the inbox stream the seqs of the entry's
// turn count in: the turn's own InboxID, or, when it names none, the
// entry's. Empty when the entry has no turn.
func (e *SessionEntry) TurnInboxID() string {
	if e == nil || e.Turn == nil {
		return ""
	}
	if e.Turn.InboxID != "" {
		return e.Turn.InboxID
	}
	return e.InboxID
}

// SetOrigin records src as the entry's origin, and its chat name, when it
// has one, as the display name. The name is stored once: the origin's
// chat_name is left empty when it equals the display name, and
// OriginSource puts it back.
func (e *SessionEntry) SetOrigin(src SessionSource) {
	if src.ChatName != "" {
		e.DisplayName = src.ChatName
	}
	if src.ChatName == e.DisplayName {
		src.ChatName = ""
	}
	e.Origin = &src
}

// OriginSource returns the entry's origin with its chat name (the display
// name when the origin does not carry its own, see SetOrigin); false when
// the entry has no origin.
func (e *SessionEntry) OriginSource() (SessionSource, bool) {
	if e == nil || e.Origin == nil {
		return SessionSource{}, false
	}
	o := *e.Origin
	if o.ChatName == "" {
		o.ChatName = e.DisplayName
	}
	return o, true
}
