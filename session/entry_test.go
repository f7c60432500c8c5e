package session_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/session"
)

func fullEntry() *session.SessionEntry {
	marked := time.Date(2026, 6, 16, 10, 0, 0, 0, time.UTC)
	return &session.SessionEntry{
		SessionKey: "agent:main:telegram:dm:1", SessionID: "20260616_100000_0a1b2c3d",
		CreatedAt: time.Date(2026, 6, 16, 9, 0, 0, 0, time.UTC), UpdatedAt: time.Date(2026, 6, 16, 9, 30, 0, 123000000, time.UTC),
		Origin:      &session.SessionSource{Platform: session.PlatformTelegram, ChatID: "1", ChatType: "dm", UserName: "Alice"},
		DisplayName: "Alice", Platform: session.PlatformTelegram, ChatType: "dm",
		InputTokens: 1, OutputTokens: 2, CacheReadTokens: 3, CacheWriteTokens: 4, TotalTokens: 10,
		EstimatedCostUSD: 0.25, CostStatus: "estimated", LastPromptTokens: 7,
		WasAutoReset: true, AutoResetReason: "idle", ResetHadActivity: true, IsFreshReset: true,
		ExpiryFinalized: true, Suspended: true, ResumePending: true, ResumeReason: "restart_timeout",
		LastResumeMarkedAt: &marked,
		Owner:              "w1/abc", LeaseEpoch: 9, InboxID: "inbox-uuid", CommittedSeq: 42,
		Turn: &session.TurnIntent{
			ID: "turn-1", FirstSeq: 40, LastSeq: 42, Kind: "messages", Attempt: 2,
			SessionID: "20260616_100000_0a1b2c3d", PreviousSessionID: "20260615_100000_00000000",
			ResetReason: "idle", Notices: []string{"n1"}, Notes: []string{"a", "b"},
			Owner: "w1/abc", Epoch: 9, StartedAt: time.Date(2026, 6, 16, 9, 31, 0, 0, time.UTC),
		},
		InterruptedTurns: 1, LastTurnID: "turn-0", BusyMode: "queue", ParentSessionID: "parent",
		ExpiryFailures: 2, QueueDepth: 3,
	}
}

func TestSessionEntryJSONRoundTrip(t *testing.T) {
	t.Parallel()
	e := fullEntry()
	data, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	var back session.SessionEntry
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, e) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, *e)
	}
	// Every field is snake_case on the wire.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"session_key", "last_resume_marked_at", "lease_epoch", "committed_seq", "turn", "interrupted_turns", "queue_depth"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
}

func TestSessionEntryDecodesOldRecord(t *testing.T) {
	t.Parallel()
	old := `{
		"session_key": "agent:main:telegram:dm:12345",
		"session_id": "20250101_080000_deadbeef",
		"created_at": "2025-01-01T08:00:00Z",
		"updated_at": "2025-01-01T09:15:00+01:00",
		"memory_flushed": true,
		"some_future_field": {"nested": [1, 2, 3]}
	}`
	var e session.SessionEntry
	if err := json.Unmarshal([]byte(old), &e); err != nil {
		t.Fatalf("Unmarshal old record: %v", err)
	}
	if got, want := e.SessionKey, "agent:main:telegram:dm:12345"; got != want {
		t.Errorf("SessionKey = %q, want %q", got, want)
	}
	if got, want := e.SessionID, "20250101_080000_deadbeef"; got != want {
		t.Errorf("SessionID = %q, want %q", got, want)
	}
	if got, want := e.CreatedAt, time.Date(2025, 1, 1, 8, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("CreatedAt = %v, want %v", got, want)
	}
	if got, want := e.UpdatedAt, time.Date(2025, 1, 1, 8, 15, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("UpdatedAt = %v, want %v", got, want)
	}
	// Everything missing is the zero value (an empty cost_status reads as
	// unknown).
	want := session.SessionEntry{SessionKey: e.SessionKey, SessionID: e.SessionID, CreatedAt: e.CreatedAt, UpdatedAt: e.UpdatedAt}
	if !reflect.DeepEqual(e, want) {
		t.Errorf("old record decoded to %+v, want only the four fields set", e)
	}
}

func TestSessionEntryOmitsEmptyOptionalFields(t *testing.T) {
	t.Parallel()
	data, err := json.Marshal(session.SessionEntry{SessionKey: "k", SessionID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"origin", "turn", "last_resume_marked_at", "owner", "lease_epoch"} {
		if _, ok := raw[k]; ok {
			t.Errorf("empty entry JSON has %q: %s", k, data)
		}
	}
}

func TestSessionEntryClone(t *testing.T) {
	t.Parallel()
	e := fullEntry()
	c := e.Clone()
	if !reflect.DeepEqual(c, e) {
		t.Fatalf("Clone() = %+v, want %+v", c, e)
	}
	if c.Origin == e.Origin || c.Turn == e.Turn || c.LastResumeMarkedAt == e.LastResumeMarkedAt {
		t.Fatal("Clone() shares a pointer with the original")
	}

	// Mutating the clone leaves the original alone.
	c.Origin.ChatID = "changed"
	*c.LastResumeMarkedAt = c.LastResumeMarkedAt.Add(time.Hour)
	c.Turn.ID = "changed"
	c.Turn.Notices[0] = "changed"
	c.Turn.Notes = append(c.Turn.Notes[:1], "changed")
	c.SessionID = "changed"
	if !reflect.DeepEqual(e, fullEntry()) {
		t.Errorf("mutating the clone changed the original: %+v", e)
	}

	// Nil stays nil; empty slices stay empty and non-nil.
	var nilEntry *session.SessionEntry
	if nilEntry.Clone() != nil {
		t.Error("nil.Clone() != nil")
	}
	bare := (&session.SessionEntry{SessionKey: "k"}).Clone()
	if bare.Origin != nil || bare.Turn != nil || bare.LastResumeMarkedAt != nil {
		t.Errorf("Clone() of a bare entry = %+v", bare)
	}
	empty := (&session.SessionEntry{Turn: &session.TurnIntent{Notices: []string{}}}).Clone()
	if empty.Turn.Notices == nil || len(empty.Turn.Notices) != 0 || empty.Turn.Notes != nil {
		t.Errorf("Clone() changed empty/nil slices: %#v", empty.Turn)
	}
}

// TestTurnInboxID: a turn's seqs count in the stream its record names, and
// in the entry's when it names none (a record written before turns named
// their stream), which decodes as before.
func TestTurnInboxID(t *testing.T) {
	var e session.SessionEntry
	if err := json.Unmarshal([]byte(`{"inbox_id":"new","committed_seq":2,"turn":{"id":"t","first_seq":4,"last_seq":4}}`), &e); err != nil {
		t.Fatal(err)
	}
	if got := e.TurnInboxID(); got != "new" {
		t.Fatalf("a record without its stream: %q, want the entry's", got)
	}
	e.Turn.InboxID = "old"
	data, err := json.Marshal(&e)
	if err != nil {
		t.Fatal(err)
	}
	var back session.SessionEntry
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if got := back.TurnInboxID(); got != "old" {
		t.Fatalf("a record naming its stream: %q after a round trip, want old", got)
	}
	back.Turn = nil
	if got := back.TurnInboxID(); got != "" {
		t.Fatalf("no turn: %q", got)
	}
}
