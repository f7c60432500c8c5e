package telemetry

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// ListServices asks the NATS micro services named name (every service when
// name is "") for their INFO, as `nats micro ls` does, and returns the
// answers sorted by name and id. It gathers answers until wait has passed,
// or until stall has passed without one once the first arrived.
func ListServices(ctx context.Context, nc *nats.Conn, name string, wait, stall time.Duration) ([]micro.Info, error) {
	subject, err := micro.ControlSubject(micro.InfoVerb, name, "")
	if err != nil {
		return nil, err
	}
	inbox := nc.NewRespInbox()
	var mu sync.Mutex
	var out []micro.Info
	var decodeErr error
	got := make(chan struct{}, 1)
	sub, err := nc.Subscribe(inbox, func(m *nats.Msg) {
		var in micro.Info
		mu.Lock()
		defer mu.Unlock()
		if err := json.Unmarshal(m.Data, &in); err != nil {
			decodeErr = fmt.Errorf("telemetry: INFO answer from %s: %w", m.Subject, err)
			return
		}
		out = append(out, in)
		select {
		case got <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe() //nolint:errcheck
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil, err
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	var quiet <-chan time.Time
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline.C:
			done = true
		case <-got:
			quiet = time.After(stall)
		case <-quiet:
			done = true
		}
	}
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].ID < out[j].ID
	})
	return out, decodeErr
}

// WriteServices writes infos as the table `nats micro ls` prints: name, id,
// version and description of each service.
func WriteServices(w io.Writer, infos []micro.Info) {
	t := table.NewWriter()
	t.SetOutputMirror(w)
	t.SetTitle("All Micro Services")
	t.AppendHeader(table.Row{"Name", "Version", "ID", "Description"})
	for _, in := range infos {
		t.AppendRow(table.Row{in.Name, in.Version, in.ID, in.Description})
	}
	t.Render()
}
