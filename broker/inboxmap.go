package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// MaxInboxStreams bounds the number of inbox streams (4 partitions per
// stream at least). The NATS permissions of the roles name each inbox stream
// there can be (a stream name cannot be matched by a subject wildcard), so
// the bound keeps them short; 16 leaders are plenty for the clusters the
// fleet runs on.
const MaxInboxStreams = 16

// InboxMapKey is the key of the inbox map in the InboxMapBucket.
const InboxMapKey = "map"

// InboxMap says which inbox stream holds each of the fixed partitions. It
// lives in KV (InboxMapBucket, key InboxMapKey) and changes only through
// the migration (admin.MigrateInbox), by compare-and-set, one step at a
// time, each step safe on its own.
//
// A partition's stream is where its messages are read. A closed partition
// is in no stream's subjects: its publishes fail (the ingress retries them)
// while it is moved. Only the stream a partition is assigned to ever holds
// messages of that partition (a move purges the old stream's copy once it is
// drained), which is what lets an owner meeting a lane on another stream
// start its committed seq over.
type InboxMap struct {
	// Streams is how many inbox streams exist, 0..Streams-1. During a
	// migration it is the larger of the old and the new count.
	Streams int `json:"streams"`
	// Assign is the stream index of each partition (len Partitions).
	Assign []int `json:"assign"`
	// Moving lists the partitions being moved: they take no publishes
	// until the move ends.
	Moving []Move `json:"moving,omitempty"`
	// Target is the stream count a migration under way moves to; 0 when
	// none is under way.
	Target int `json:"target,omitempty"`
	// From is the stream count the migration under way started from.
	From int `json:"from,omitempty"`
}

// DefaultInboxMap spreads the partitions over n streams: partition p lives
// in stream p mod n, so a lane's stream follows from its partition alone and
// 1 stream is the layout of a fleet that never set the count.
func DefaultInboxMap(n int) InboxMap {
	m := InboxMap{Streams: n, Assign: make([]int, Partitions)}
	for p := range m.Assign {
		m.Assign[p] = p % n
	}
	return m
}

// CheckInboxStreams validates a configured stream count (0 means "keep").
func CheckInboxStreams(n int) error {
	if n < 0 || n > MaxInboxStreams {
		return fmt.Errorf("inbox streams %d: want 1 to %d", n, MaxInboxStreams)
	}
	return nil
}

// Validate checks the map's shape.
func (m InboxMap) Validate() error {
	if m.Streams < 1 || m.Streams > MaxInboxStreams {
		return fmt.Errorf("inbox map: %d streams, want 1 to %d", m.Streams, MaxInboxStreams)
	}
	if len(m.Assign) != Partitions {
		return fmt.Errorf("inbox map: %d partitions assigned, want %d", len(m.Assign), Partitions)
	}
	for p, s := range m.Assign {
		if s < 0 || s >= m.Streams {
			return fmt.Errorf("inbox map: partition %d in stream %d of %d", p, s, m.Streams)
		}
	}
	for _, mv := range m.Moving {
		if mv.P < 0 || mv.P >= Partitions || mv.From < 0 || mv.From >= m.Streams || mv.To < 0 || mv.To >= m.Streams {
			return fmt.Errorf("inbox map: move %+v out of range", mv)
		}
	}
	if m.Target < 0 || m.Target > MaxInboxStreams {
		return fmt.Errorf("inbox map: target %d out of range", m.Target)
	}
	return nil
}

// Migrating reports whether a change of the stream count is under way.
func (m InboxMap) Migrating() bool { return m.Target != 0 || len(m.Moving) > 0 }

// Count is the stream count the fleet has, or is moving to.
func (m InboxMap) Count() int {
	if m.Target != 0 {
		return m.Target
	}
	return m.Streams
}

// IsOpen reports whether partition p takes publishes.
func (m InboxMap) IsOpen(p int) bool {
	return !slices.ContainsFunc(m.Moving, func(mv Move) bool { return mv.P == p })
}

// Move is a partition on its way from one stream to another.
type Move struct {
	P    int `json:"p"`
	From int `json:"from"`
	To   int `json:"to"`
	// Closed is when the partition stopped taking publishes (the batch's
	// close); zero in maps written before it was recorded.
	Closed time.Time `json:"closed,omitzero"`
	// Drained bounds the purge of the partition from its old stream: every
	// message of the partition there up to this seq was committed when the
	// drain ended. Set with the flip (the same compare-and-set) and only
	// then; nil while the partition still reads from its old stream.
	Drained *uint64 `json:"drained,omitempty"`
}

// Flipped reports whether the map already names the move's new stream for
// its partition.
func (m InboxMap) Flipped(mv Move) bool { return m.Assign[mv.P] == mv.To }

// PartitionsOf returns the partitions assigned to stream i, open or not.
func (m InboxMap) PartitionsOf(i int) []int {
	var out []int
	for p, s := range m.Assign {
		if s == i {
			out = append(out, p)
		}
	}
	return out
}

// Subjects are the subjects stream i takes: the wildcard when one stream
// holds every partition and none is closed (the layout of a fleet that never
// set the count), else the exact subjects of its open partitions and the
// stream's control subject (InboxControlSubject: the migration's markers;
// the only subject of a stream that holds no partition, as JetStream would
// otherwise give a stream with no subjects its own name as one).
func (m InboxMap) Subjects(n Names, i int) []string {
	if m.Streams == 1 && len(m.Moving) == 0 {
		return []string{n.InboxWildcard()}
	}
	var out []string
	for _, p := range m.PartitionsOf(i) {
		if m.IsOpen(p) {
			out = append(out, n.InboxPartitionSubject(p))
		}
	}
	return append(out, n.InboxControlSubject(i))
}

// Clone returns a deep copy.
func (m InboxMap) Clone() InboxMap {
	out := m
	out.Assign = slices.Clone(m.Assign)
	out.Moving = slices.Clone(m.Moving)
	return out
}

// String is a short description for logs and errors.
func (m InboxMap) String() string {
	s := fmt.Sprintf("%d streams", m.Streams)
	if m.Target != 0 {
		s += fmt.Sprintf(", migrating to %d", m.Target)
	}
	if len(m.Moving) > 0 {
		s += fmt.Sprintf(", %d partitions moving", len(m.Moving))
	}
	return s
}

// DecodeInboxMap parses and validates a stored map.
func DecodeInboxMap(data []byte) (InboxMap, error) {
	var m InboxMap
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("inbox map: %w", err)
	}
	return m, m.Validate()
}

// Encode is the stored form.
func (m InboxMap) Encode() []byte {
	b, _ := json.Marshal(m)
	return b
}

// ErrInboxStreams is returned by Provision when the configuration asks for
// another number of inbox streams than the fleet has: the count changes only
// through a migration, never by restarting with another setting.
var ErrInboxStreams = errors.New("inbox stream count differs from the fleet's")

// InboxStreamAt is the name of inbox stream i. Stream 0 keeps the name of the
// single inbox stream, so a fleet that never set the count keeps its stream.
func (n Names) InboxStreamAt(i int) string {
	if i == 0 {
		return n.InboxStream()
	}
	return n.InboxStream() + "_" + strconv.Itoa(i)
}

// InboxStreamIndex is the index of an inbox stream name; false when name is
// not one of this fleet's inbox streams.
func (n Names) InboxStreamIndex(name string) (int, bool) {
	if name == n.InboxStream() {
		return 0, true
	}
	rest, ok := strings.CutPrefix(name, n.InboxStream()+"_")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 1 || i >= MaxInboxStreams || strconv.Itoa(i) != rest {
		return 0, false
	}
	return i, true
}

// InboxPartitionSubject matches every lane of partition p.
func (n Names) InboxPartitionSubject(p int) string { return n.prefix + ".in." + strconv.Itoa(p) + ".>" }

// InboxControlSubject is inbox stream i's own subject outside the lanes
// (and outside InboxWildcard, so never republished as a hint): the
// migration publishes its drain markers there (admin.MigrateInbox), which
// the workers acknowledge and otherwise ignore. Every inbox stream takes it
// but the one stream of the wildcard layout, which no migration is moving.
func (n Names) InboxControlSubject(i int) string { return n.prefix + ".inctl." + strconv.Itoa(i) }

// InboxControlPrefix starts every inbox stream's control subject.
func (n Names) InboxControlPrefix() string { return n.prefix + ".inctl." }

// InboxMapBucket holds the inbox map.
func (n Names) InboxMapBucket() string { return n.prefix + "_inbox" }
