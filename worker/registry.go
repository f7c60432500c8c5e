package worker

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/session"
)

// Worker states in the registry.
const (
	StateRunning  = "running"
	StateDraining = "draining"
	StateStopped  = "stopped"
)

// WorkerRecord is a worker's registry entry in the workers bucket, renewed
// by heartbeats with a server-side TTL: a worker that dies disappears from
// the registry by itself; one that stops cleanly leaves a stopped record for
// a while.
type WorkerRecord struct {
	ID           string    `json:"id"`
	Owner        string    `json:"owner"`
	Version      string    `json:"version,omitempty"`
	State        string    `json:"state"`
	Host         string    `json:"host"`
	PID          int       `json:"pid"`
	StartedAt    time.Time `json:"started_at"`
	HeartbeatAt  time.Time `json:"heartbeat_at"`
	StoppedAt    time.Time `json:"stopped_at,omitzero"`
	LanesOwned   int       `json:"lanes_owned"`
	TurnsRunning int       `json:"turns_running"`
	Turns        int64     `json:"turns"`
	Takeovers    int64     `json:"takeovers"`
	Recoveries   int64     `json:"recoveries"`
	DeadLetters  int64     `json:"dead_letters"`
	CacheSize    int       `json:"cache_size"`
	Watcher      bool      `json:"watcher,omitempty"`
	// Sweeps and ExpiryWakes count this worker's work as the watcher's
	// leader: expiry sweeps run, lanes woken when their lease expired.
	Sweeps      int64 `json:"sweeps,omitempty"`
	ExpiryWakes int64 `json:"expiry_wakes,omitempty"`
}

// stoppedRecordTTL is how long a cleanly stopped worker stays listed.
const stoppedRecordTTL = time.Hour

func (w *Worker) registryKey() string { return session.LaneToken(w.cfg.ID) }

func (w *Worker) record(state string) WorkerRecord {
	host, _ := os.Hostname()
	r := WorkerRecord{
		ID: w.cfg.ID, Owner: w.owner, Version: w.cfg.Version, State: state, Host: host, PID: os.Getpid(), StartedAt: w.started,
		HeartbeatAt: time.Now(), LanesOwned: w.LanesOwned(), TurnsRunning: w.turns.inUse(),
		Turns: w.stats.Turns.Load(), Takeovers: w.stats.Takeovers.Load(), Recoveries: w.stats.Recoveries.Load(),
		DeadLetters: w.stats.DeadLetters.Load(), CacheSize: w.cache.len(), Watcher: w.watcherLeader.Load(),
		Sweeps: w.stats.Sweeps.Load(), ExpiryWakes: w.stats.ExpiryWakes.Load(),
	}
	if state == StateStopped {
		r.StoppedAt = r.HeartbeatAt
	}
	return r
}

// heartbeat writes the worker's record with a TTL of three heartbeats.
func (w *Worker) heartbeat(state string, ttl time.Duration) error {
	data, err := json.Marshal(w.record(state))
	if err != nil {
		return err
	}
	msg := nats.NewMsg("$KV." + w.names.WorkersBucket() + "." + w.registryKey())
	msg.Data = data
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = w.js.PublishMsg(ctx, msg, jetstream.WithMsgTTL(ttl))
	return err
}

func (w *Worker) heartbeatLoop(stop <-chan struct{}) {
	every := w.cfg.LeaseTTL / 3
	t := time.NewTicker(every)
	defer t.Stop()
	state := StateRunning
	for {
		if err := w.heartbeat(state, 3*every+time.Second); err != nil {
			w.log.Debug("heartbeat", slog.Any("error", err))
		}
		select {
		case <-stop:
			return
		case <-w.drainCh:
			state = StateDraining
			select {
			case <-stop:
				return
			case <-t.C:
			}
		case <-t.C:
		}
	}
}

// ListWorkers reads the worker registry, newest heartbeat first.
func ListWorkers(ctx context.Context, bucket jetstream.KeyValue) ([]WorkerRecord, error) {
	lister, err := bucket.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	// The lister stops its watcher itself once the keys are listed; Stop's
	// error only says it already did. A context that ended cut the list.
	_ = lister.Stop()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []WorkerRecord
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			continue
		}
		seen[k] = true
		e, err := bucket.Get(ctx, k)
		if err != nil {
			continue
		}
		var r WorkerRecord
		if json.Unmarshal(e.Value(), &r) == nil {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].HeartbeatAt.After(out[j].HeartbeatAt) })
	return out, nil
}

// othersAlive reports whether another worker is registered as running (the
// registry's TTL removes dead ones). It is asked once per drain and lane.
func (w *Worker) othersAlive() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	recs, err := ListWorkers(ctx, w.res.Workers)
	if err != nil {
		w.log.Debug("worker registry", slog.Any("error", err))
		return true // unknown: stay quiet rather than alarm users
	}
	for _, r := range recs {
		if r.Owner != w.owner && r.State == StateRunning {
			return true
		}
	}
	return false
}
