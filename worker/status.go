package worker

// Status is a worker's own status, as its micro service reports it.
type Status struct {
	ID           string `json:"id"`
	Owner        string `json:"owner"`
	LanesOwned   int    `json:"lanes_owned"`
	TurnsRunning int    `json:"turns_running"`
	CacheSize    int    `json:"cache_size"`
	Turns        int64  `json:"turns"`
	TurnsFailed  int64  `json:"turns_failed"`
	DeadLetters  int64  `json:"dead_letters"`
	Watcher      bool   `json:"watcher"`
}

// Status returns the worker's status now.
func (w *Worker) Status() Status {
	return Status{ID: w.cfg.ID, Owner: w.owner, LanesOwned: w.LanesOwned(), TurnsRunning: w.turns.inUse(),
		CacheSize: w.cache.len(), Turns: w.stats.Turns.Load(), TurnsFailed: w.stats.TurnsFailed.Load(),
		DeadLetters: w.stats.DeadLetters.Load(), Watcher: w.watcherLeader.Load()}
}
