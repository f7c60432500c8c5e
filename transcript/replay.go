package transcript

import "strings"

// These functions read a loaded transcript; they do no I/O and never modify
// the slice they are given.

// deletedSeqs returns the seqs covered by the rewind entries of entries.
func deletedSeqs(entries []Entry) map[uint64]bool {
	var del map[uint64]bool
	for i := range entries {
		if entries[i].Kind != KindRewind {
			continue
		}
		if del == nil {
			del = make(map[uint64]bool)
		}
		for _, s := range entries[i].Rewound {
			del[s] = true
		}
	}
	return del
}

// applyRewinds sets Deleted on every entry a rewind covers.
func applyRewinds(entries []Entry) {
	del := deletedSeqs(entries)
	for i := range entries {
		if del[entries[i].Seq] {
			entries[i].Deleted = true
		}
	}
}

// isDeleted reports whether e is deleted, by its flag or by a rewind in del.
func isDeleted(e *Entry, del map[uint64]bool) bool {
	return e.Deleted || del[e.Seq]
}

// Effective returns the conversation the agent sees: the KindMessage entries
// with a user, assistant, tool or system role that no rewind deleted, in
// order. Rewinds are applied whether or not Deleted was set (by Load).
func Effective(entries []Entry) []Entry {
	del := deletedSeqs(entries)
	out := make([]Entry, 0, len(entries))
	for i := range entries {
		e := &entries[i]
		if e.Kind != KindMessage || !isRole(e.Role) || isDeleted(e, del) {
			continue
		}
		out = append(out, *e)
	}
	return out
}

// TurnEnded reports whether entries hold a KindTurnEnd for turnID, and the
// status of the last such entry.
func TurnEnded(entries []Entry, turnID string) (status string, ok bool) {
	if turnID == "" {
		return "", false
	}
	for i := len(entries) - 1; i >= 0; i-- {
		if entries[i].Kind == KindTurnEnd && entries[i].TurnID == turnID {
			return entries[i].Status, true
		}
	}
	return "", false
}

// RewindUserTurns builds the control entry that soft-deletes the last n user
// turns, for /undo (n=1) and /retry: every non-deleted message entry from
// the first user message of the n-th last user turn to the end. A user turn
// is the user messages of one turn (entries of the same TurnID: a burst of
// messages, or steered ones, is one turn); entries without a TurnID are a
// turn each. Fewer user turns than n rewinds them all. It returns the entry
// to append (nil when there is nothing to rewind), how many user turns it
// rewinds, and the text of the earliest rewound user turn, its messages
// joined by newlines (what /retry sends again). entries must carry their
// Seq, as Load returns them.
func RewindUserTurns(entries []Entry, n int) (ctl *Entry, turns int, targetText string) {
	if n <= 0 {
		return nil, 0, ""
	}
	del := deletedSeqs(entries)
	live := func(e *Entry) bool {
		return e.Kind == KindMessage && !isDeleted(e, del)
	}
	start := -1
	var cur string // the TurnID of the turn being counted
	for i := len(entries) - 1; i >= 0; i-- {
		e := &entries[i]
		if !live(e) || e.Role != RoleUser {
			continue
		}
		if turns == 0 || e.TurnID == "" || e.TurnID != cur {
			if turns == n {
				break
			}
			turns++
			cur = e.TurnID
		}
		start = i
	}
	if start < 0 {
		return nil, 0, ""
	}
	var seqs []uint64
	var texts []string
	first := entries[start].TurnID
	for i := start; i < len(entries); i++ {
		e := &entries[i]
		if !live(e) {
			continue
		}
		seqs = append(seqs, e.Seq)
		if e.Role == RoleUser && (i == start || first != "" && e.TurnID == first) {
			texts = append(texts, e.Content)
		}
	}
	return &Entry{Kind: KindRewind, Rewound: seqs}, turns, strings.Join(texts, "\n")
}

// FenceEpoch returns the epoch of the last fence entry, or 0 if none.
func FenceEpoch(entries []Entry) uint64 {
	for i := len(entries) - 1; i >= 0; i-- {
		if entries[i].Kind == KindFence {
			return entries[i].Epoch
		}
	}
	return 0
}
