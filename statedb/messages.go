package statedb

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// Message is one row of the messages table. JSON columns (tool calls,
// reasoning details, codex items) are carried as raw JSON.
type Message struct {
	ID                  int64           `json:"id"`
	SessionID           string          `json:"session_id"`
	Role                string          `json:"role"`
	Content             string          `json:"content,omitempty"`
	ToolCallID          string          `json:"tool_call_id,omitempty"`
	ToolCalls           json.RawMessage `json:"tool_calls,omitempty"`
	ToolName            string          `json:"tool_name,omitempty"`
	Timestamp           time.Time       `json:"timestamp"`
	TokenCount          *int64          `json:"token_count,omitempty"`
	FinishReason        string          `json:"finish_reason,omitempty"`
	Reasoning           string          `json:"reasoning,omitempty"`
	ReasoningContent    string          `json:"reasoning_content,omitempty"`
	ReasoningDetails    json.RawMessage `json:"reasoning_details,omitempty"`
	CodexReasoningItems json.RawMessage `json:"codex_reasoning_items,omitempty"`
	CodexMessageItems   json.RawMessage `json:"codex_message_items,omitempty"`
	// DeletedAt is set on a soft-deleted message (GetMessages and search
	// leave those out; exports keep them).
	DeletedAt *time.Time `json:"deleted_at,omitempty"`
}

const messageCols = `id, session_id, role, content, tool_call_id, tool_calls, tool_name, timestamp, token_count, finish_reason,
	reasoning, reasoning_content, reasoning_details, codex_reasoning_items, codex_message_items, deleted_at`

func scanMessage(sc scanner, extra ...any) (*Message, error) {
	var m Message
	var content, callID, calls, name, finish, reasoning, rc, rd, cri, cmi sql.NullString
	var ts float64
	var tokens sql.NullInt64
	var deleted sql.NullFloat64
	dest := []any{&m.ID, &m.SessionID, &m.Role, &content, &callID, &calls, &name, &ts, &tokens, &finish,
		&reasoning, &rc, &rd, &cri, &cmi, &deleted}
	if err := sc.Scan(append(dest, extra...)...); err != nil {
		return nil, err
	}
	m.Content, m.ToolCallID, m.ToolName, m.FinishReason = content.String, callID.String, name.String, finish.String
	m.Reasoning, m.ReasoningContent = reasoning.String, rc.String
	m.ToolCalls, m.ReasoningDetails = rawJSON(calls), rawJSON(rd)
	m.CodexReasoningItems, m.CodexMessageItems = rawJSON(cri), rawJSON(cmi)
	m.Timestamp = fromUnix(ts)
	if tokens.Valid {
		v := tokens.Int64
		m.TokenCount = &v
	}
	if deleted.Valid {
		t := fromUnix(deleted.Float64)
		m.DeletedAt = &t
	}
	return &m, nil
}

// rawJSON returns a stored JSON column, or nil when it is empty or is not
// valid JSON (then it would break the document it is embedded in).
func rawJSON(s sql.NullString) json.RawMessage {
	if !s.Valid || s.String == "" || !json.Valid([]byte(s.String)) {
		return nil
	}
	return json.RawMessage(s.String)
}

// NewMessage is what AppendMessage stores.
type NewMessage struct {
	// ID, when non-zero, is the row id to use (the indexer uses the
	// transcript's stream sequence); zero lets SQLite assign one.
	ID         int64
	SessionID  string
	Role       string
	Content    string
	ToolCallID string
	// ToolCalls is serialised to JSON when non-nil.
	ToolCalls    any
	ToolName     string
	Timestamp    time.Time
	TokenCount   *int64
	FinishReason string
	Reasoning    string
	// ReasoningContent is the provider's reasoning_content field.
	ReasoningContent    string
	ReasoningDetails    any
	CodexReasoningItems any
	CodexMessageItems   any
	// ToolCallCount is how many tool calls ToolCalls holds; it is added to
	// the session's tool_call_count. Zero counts the elements of a JSON
	// array.
	ToolCallCount int
}

// AppendMessage stores a message and bumps the session's message and tool
// call counts; it returns the message id.
func (db *DB) AppendMessage(ctx context.Context, m NewMessage) (int64, error) {
	var id int64
	err := db.write(ctx, func(tx *sql.Tx) error {
		var err error
		id, err = appendMessage(ctx, tx, m)
		return err
	})
	return id, err
}

func jsonCol(v any) (any, int, error) {
	if v == nil {
		return nil, 0, nil
	}
	var b []byte
	switch x := v.(type) {
	case json.RawMessage:
		if len(x) == 0 {
			return nil, 0, nil
		}
		b = x
	case []byte:
		if len(x) == 0 {
			return nil, 0, nil
		}
		b = x
	case string:
		if x == "" {
			return nil, 0, nil
		}
		b = []byte(x)
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			return nil, 0, err
		}
	}
	if !json.Valid(b) {
		return nil, 0, fmt.Errorf("%w: not JSON: %.40q", ErrInvalid, b)
	}
	var arr []json.RawMessage
	n := 0
	if json.Unmarshal(b, &arr) == nil {
		n = len(arr)
	}
	if string(b) == "null" {
		return nil, 0, nil
	}
	return string(b), n, nil
}

func appendMessage(ctx context.Context, ex execer, m NewMessage) (int64, error) {
	if m.SessionID == "" || m.Role == "" {
		return 0, fmt.Errorf("%w: a message needs a session id and a role", ErrInvalid)
	}
	if m.Timestamp.IsZero() {
		m.Timestamp = time.Now()
	}
	calls, ncalls, err := jsonCol(m.ToolCalls)
	if err != nil {
		return 0, err
	}
	if m.ToolCallCount > 0 {
		ncalls = m.ToolCallCount
	}
	rd, _, err := jsonCol(m.ReasoningDetails)
	if err != nil {
		return 0, err
	}
	cri, _, err := jsonCol(m.CodexReasoningItems)
	if err != nil {
		return 0, err
	}
	cmi, _, err := jsonCol(m.CodexMessageItems)
	if err != nil {
		return 0, err
	}
	var id any
	if m.ID != 0 {
		id = m.ID
	}
	var tokens any
	if m.TokenCount != nil {
		tokens = *m.TokenCount
	}
	res, err := ex.ExecContext(ctx, `INSERT INTO messages (id, session_id, role, content, tool_call_id, tool_calls, tool_name, timestamp,
		token_count, finish_reason, reasoning, reasoning_content, reasoning_details, codex_reasoning_items, codex_message_items)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		id, m.SessionID, m.Role, nullStr(m.Content), nullStr(m.ToolCallID), calls, nullStr(m.ToolName), unix(m.Timestamp),
		tokens, nullStr(m.FinishReason), nullStr(m.Reasoning), nullStr(m.ReasoningContent), rd, cri, cmi)
	if err != nil {
		return 0, err
	}
	rowID, err := res.LastInsertId()
	if err != nil {
		return 0, err
	}
	if _, err := ex.ExecContext(ctx, `UPDATE sessions SET message_count = message_count + 1, tool_call_count = tool_call_count + ? WHERE id = ?`,
		ncalls, m.SessionID); err != nil {
		return 0, err
	}
	return rowID, nil
}

// softDelete marks messages of a session deleted (a rewind); the session's
// counts drop by what they covered. Already deleted messages are skipped.
func softDelete(ctx context.Context, ex execer, sessionID string, ids []int64, at time.Time) error {
	for _, id := range ids {
		var ncalls int
		var calls sql.NullString
		err := ex.QueryRowContext(ctx, `SELECT tool_calls FROM messages WHERE id = ? AND session_id = ? AND deleted_at IS NULL`, id, sessionID).Scan(&calls)
		if err == sql.ErrNoRows {
			continue
		}
		if err != nil {
			return err
		}
		if calls.Valid {
			var arr []json.RawMessage
			if json.Unmarshal([]byte(calls.String), &arr) == nil {
				ncalls = len(arr)
			}
		}
		if _, err := ex.ExecContext(ctx, `UPDATE messages SET deleted_at = ? WHERE id = ?`, unix(at), id); err != nil {
			return err
		}
		if _, err := ex.ExecContext(ctx, `UPDATE sessions SET message_count = MAX(message_count - 1, 0),
			tool_call_count = MAX(tool_call_count - ?, 0) WHERE id = ?`, ncalls, sessionID); err != nil {
			return err
		}
	}
	return nil
}

// GetMessages returns a session's messages in order, soft-deleted ones left out.
func (db *DB) GetMessages(ctx context.Context, sessionID string) ([]Message, error) {
	return getMessages(ctx, db.r, sessionID, false)
}

func getMessages(ctx context.Context, ex execer, sessionID string, withDeleted bool) ([]Message, error) {
	q := `SELECT ` + messageCols + ` FROM messages WHERE session_id = ?`
	if !withDeleted {
		q += ` AND deleted_at IS NULL`
	}
	rows, err := ex.QueryContext(ctx, q+` ORDER BY timestamp, id`, sessionID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Message{}
	for rows.Next() {
		m, err := scanMessage(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, *m)
	}
	return out, rows.Err()
}

// ConversationMessage is one message in the OpenAI chat format, for replay.
type ConversationMessage struct {
	Role                string          `json:"role"`
	Content             string          `json:"content"`
	ToolCallID          string          `json:"tool_call_id,omitempty"`
	ToolCalls           json.RawMessage `json:"tool_calls,omitempty"`
	Name                string          `json:"name,omitempty"`
	Reasoning           string          `json:"reasoning,omitempty"`
	ReasoningDetails    json.RawMessage `json:"reasoning_details,omitempty"`
	CodexReasoningItems json.RawMessage `json:"codex_reasoning_items,omitempty"`
}

// GetMessagesAsConversation returns a session's live messages in the
// OpenAI conversation format: role and content, tool calls and tool call
// ids, the tool name on tool results, and the reasoning fields of
// assistant messages (so providers that replay reasoning get it back).
func (db *DB) GetMessagesAsConversation(ctx context.Context, sessionID string) ([]ConversationMessage, error) {
	msgs, err := db.GetMessages(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	out := make([]ConversationMessage, 0, len(msgs))
	for _, m := range msgs {
		c := ConversationMessage{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID, ToolCalls: m.ToolCalls}
		if m.Role == "tool" {
			c.Name = m.ToolName
		}
		if m.Role == "assistant" {
			c.Reasoning, c.ReasoningDetails, c.CodexReasoningItems = m.Reasoning, m.ReasoningDetails, m.CodexReasoningItems
		}
		out = append(out, c)
	}
	return out, nil
}

// Usage is what a turn adds to its session's counters.
type Usage struct {
	InputTokens      int64
	OutputTokens     int64
	CacheReadTokens  int64
	CacheWriteTokens int64
	ReasoningTokens  int64
	APICalls         int64
}

// AddUsage adds token counts and API calls to a session.
func (db *DB) AddUsage(ctx context.Context, sessionID string, u Usage) error {
	return db.write(ctx, func(tx *sql.Tx) error { return addUsage(ctx, tx, sessionID, u) })
}

func addUsage(ctx context.Context, ex execer, sessionID string, u Usage) error {
	_, err := ex.ExecContext(ctx, `UPDATE sessions SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,
		cache_read_tokens = cache_read_tokens + ?, cache_write_tokens = cache_write_tokens + ?,
		reasoning_tokens = reasoning_tokens + ?, api_call_count = api_call_count + ? WHERE id = ?`,
		u.InputTokens, u.OutputTokens, u.CacheReadTokens, u.CacheWriteTokens, u.ReasoningTokens, u.APICalls, sessionID)
	return err
}
