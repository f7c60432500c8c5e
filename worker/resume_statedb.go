package worker

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/statedb"
)

// stateDBTimeout bounds a /resume request to the state database. With no
// indexer running the request fails at once (no responders); the timeout
// covers one that is busy or gone.
const stateDBTimeout = 3 * time.Second

// stateDBLimit is how many of a lane's named sessions /resume asks for.
const stateDBLimit = 50

// namedFromStateDB asks the state database (the fleet.api micro service an
// indexer serves) for this lane's sessions that have a title, newest first,
// ended ones included. ok is false when no indexer answers, or it answers
// with an error: /resume then lists from the session index in KV alone.
func (l *lane) namedFromStateDB() (named []namedSession, ok bool) {
	req, err := json.Marshal(statedb.SessionsRequest{Lane: l.lane, Titled: true, Limit: stateDBLimit})
	if err != nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.ctx), stateDBTimeout)
	defer cancel()
	msg, err := l.w.nc.RequestWithContext(ctx, l.w.names.APIPrefix()+"."+statedb.EndpointSessions, req)
	if err != nil {
		l.w.log.Debug("resume: state database unavailable, listing from the session index", slog.String("lane", l.lane), slog.Any("error", err))
		return nil, false
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		l.w.log.Debug("resume: state database error, listing from the session index", slog.String("lane", l.lane), slog.String("code", code),
			slog.String("error", msg.Header.Get(micro.ErrorHeader)))
		return nil, false
	}
	var resp statedb.SessionsResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, false
	}
	for _, s := range resp.Sessions {
		if s.Title == "" {
			continue
		}
		named = append(named, namedSession{id: s.ID, title: s.Title, created: s.StartedAt, ended: s.EndedAt != nil})
	}
	return named, true
}

// withStateDB completes the /resume list read from the session index (kv,
// the lane's recent sessions) with the state database's: sessions the
// index no longer lists (older than its recent ones) are added, and those
// the database knows are marked ended when they ended. A title in the
// index wins over the database's (the index is what the lane resolves
// against). Without an indexer the list is kv's, unchanged.
func (l *lane) withStateDB(kv []namedSession) []namedSession {
	db, ok := l.namedFromStateDB()
	if !ok {
		return kv
	}
	out := slices.Clone(kv)
	at := make(map[string]int, len(out))
	for i, n := range out {
		at[n.id] = i
	}
	for _, n := range db {
		if n.id == l.entry.SessionID {
			continue
		}
		if i, known := at[n.id]; known {
			out[i].ended = n.ended
			continue
		}
		out = append(out, n)
	}
	slices.SortStableFunc(out, func(a, b namedSession) int { return b.created.Compare(a.created) })
	return out
}

// titleFromStateDB resolves a title among this lane's named sessions the
// state database knows (those the session index still lists were tried
// first): the newest of the title's lineage, or the exact "Title #N".
func (l *lane) titleFromStateDB(title string) string {
	db, ok := l.namedFromStateDB()
	if !ok {
		return ""
	}
	base, n := titleBase(title)
	exact := strings.HasSuffix(strings.TrimSpace(title), "#"+strconv.Itoa(n))
	for _, s := range db {
		b, m := titleBase(s.title)
		if strings.EqualFold(b, base) && (!exact || m == n) {
			return s.id
		}
	}
	return ""
}
