package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/session"
	"github.com/agentfleet/agentfleet/worker"
)

// leaseDoc is what a lane's lease key holds, as fleetctl reports it.
type leaseDoc struct {
	Owner    string    `json:"owner"`
	Epoch    uint64    `json:"epoch"`
	Revision uint64    `json:"revision"`
	TTL      string    `json:"ttl"`
	Renewed  time.Time `json:"renewed_at"`
	TTLLeft  string    `json:"ttl_left"`
}

// readLease reads the lane's live lease, or nil when no lease is held.
func readLease(ctx context.Context, cl *client, lane string) (*leaseDoc, error) {
	e, err := cl.res.Leases.Get(ctx, lane)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var v struct {
		Owner string `json:"owner"`
		Epoch uint64 `json:"epoch"`
		TTLMS int64  `json:"ttl_ms"`
	}
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return nil, fmt.Errorf("lease of %s: %w", lane, err)
	}
	ttl := time.Duration(v.TTLMS) * time.Millisecond
	d := &leaseDoc{Owner: v.Owner, Epoch: v.Epoch, Revision: e.Revision(), TTL: ttl.String(), Renewed: e.Created()}
	if d.Epoch == 0 {
		d.Epoch = e.Revision() // a create's own revision is its epoch
	}
	// The server judges expiry; this is for display, from the server's
	// write time and this machine's clock.
	d.TTLLeft = max(0, time.Until(e.Created().Add(ttl))).Round(100 * time.Millisecond).String()
	return d, nil
}

func laneCommand() *cli.Command {
	return &cli.Command{
		Name:  "lane",
		Usage: "a lane's lease and inbox",
		Subcommands: []*cli.Command{
			{
				Name:      "show",
				Usage:     "owner, lease TTL left, epoch, committed seq, backlog above it, queue, and the turn in flight",
				ArgsUsage: "KEY_OR_LANE_OR_SESSION_ID",
				Flags:     []cli.Flag{jsonFlag()},
				Action: func(c *cli.Context) error {
					cl, ctx, done, lane, err := dialLane(c, "usage: fleetctl lane show KEY_OR_LANE_OR_SESSION_ID")
					if err != nil {
						return err
					}
					defer done()
					e, rev, err := cl.store.Get(ctx, lane)
					if err != nil {
						return err
					}
					lease, err := readLease(ctx, cl, lane)
					if err != nil {
						return err
					}
					after := uint64(0)
					if e.InboxID == cl.res.InboxID {
						after = e.CommittedSeq
					}
					queued, pending, err := inboxBacklog(ctx, cl, lane, after)
					if err != nil {
						return fmt.Errorf("read the lane's inbox: %w", err)
					}
					if c.Bool("json") {
						return printJSON(c.App.Writer, map[string]any{"lane": lane, "session_key": e.SessionKey, "session_id": e.SessionID,
							"lease": lease, "entry_owner": e.Owner, "entry_epoch": e.LeaseEpoch, "committed_seq": e.CommittedSeq,
							"backlog": pending, "queue": queued, "turn": e.Turn, "revision": rev})
					}
					f := newFields()
					f.add("lane", lane)
					f.add("session_key", e.SessionKey)
					f.add("session_id", e.SessionID)
					if lease != nil {
						f.add("lease_owner", lease.Owner)
						f.add("lease_epoch", lease.Epoch)
						f.add("lease_ttl_left", lease.TTLLeft+" of "+lease.TTL)
					} else {
						f.add("lease_owner", "(none)")
					}
					f.add("entry_owner", e.Owner)
					f.add("entry_epoch", e.LeaseEpoch)
					f.add("committed_seq", e.CommittedSeq)
					f.add("backlog", pending)
					f.add("queue", queued)
					if e.Turn != nil {
						f.add("turn", fmt.Sprintf("%s (session %s)", e.Turn.ID, e.Turn.SessionID))
					} else {
						f.add("turn", "(none)")
					}
					return f.print(c.App.Writer)
				},
			},
			{
				Name: "break-lease",
				Usage: "force a takeover: the lease is replaced by a 1s lease of fleetctl's that the server expires, " +
					"so the fleet handles it exactly like its owner's crash (the owner is fenced; another worker resumes the lane)",
				ArgsUsage: "KEY_OR_LANE_OR_SESSION_ID",
				Flags:     []cli.Flag{jsonFlag()},
				Action: func(c *cli.Context) error {
					cl, ctx, done, lane, err := dialLane(c, "usage: fleetctl lane break-lease KEY_OR_LANE_OR_SESSION_ID")
					if err != nil {
						return err
					}
					defer done()
					broken, err := breakLease(ctx, cl, lane)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(c.App.Writer, map[string]any{"lane": lane, "broken": broken})
					}
					if broken == nil {
						fmt.Fprintf(c.App.Writer, "%s: no lease held; nothing to break\n", lane)
						return nil
					}
					fmt.Fprintf(c.App.Writer, "broke the lease of %s held by %s (epoch %d): the next owner takes over at a higher epoch\n", lane, broken.Owner, broken.Epoch)
					return nil
				},
			},
		},
	}
}

// breakOwner is the owner id of the placeholder lease break-lease writes.
const breakOwner = "fleetctl/break-lease"

// breakLease replaces the lane's live lease, at the revision read, by a
// one-second lease of breakOwner. Its owner's next renewal or fenced write
// is refused (the key no longer holds its lease); the server expires the
// placeholder with a MaxAge marker, which the fleet's expiry watch treats
// as any expired lease: it wakes the lane, and the worker that takes it
// creates a new lease at a higher revision, the new epoch that fences the
// old owner's transcript and entry writes. It returns the lease broken, or
// nil when none was held.
func breakLease(ctx context.Context, cl *client, lane string) (*leaseDoc, error) {
	for attempt := 0; attempt < 5; attempt++ {
		cur, err := readLease(ctx, cl, lane)
		if err != nil || cur == nil {
			return nil, err
		}
		if cur.Owner == breakOwner {
			return cur, nil // broken already, not yet expired
		}
		data, _ := json.Marshal(map[string]any{"owner": breakOwner, "ttl_ms": time.Second.Milliseconds()})
		msg := nats.NewMsg("$KV." + cl.names.LeasesBucket() + "." + lane)
		msg.Data = data
		_, err = cl.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(cur.Revision), jetstream.WithMsgTTL(time.Second))
		if err == nil {
			return cur, wakeAfterBreak(ctx, cl, lane)
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			continue // renewed meanwhile: break the renewal
		}
		return nil, fmt.Errorf("break the lease of %s: %w", lane, err)
	}
	return nil, fmt.Errorf("break the lease of %s: it keeps changing; try again", lane)
}

// wakeAfterBreak waits for the server to expire the placeholder lease and
// then wakes the lane if it has work, with the wake-up the expiry watch
// sends (same Msg-Id, so the lane is woken once): the takeover does not
// depend on which worker leads the watch, nor on the old owner's
// deliveries coming back.
func wakeAfterBreak(ctx context.Context, cl *client, lane string) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		cur, err := readLease(ctx, cl, lane)
		if err != nil {
			return err
		}
		if cur != nil && cur.Owner != breakOwner {
			return nil // taken over already
		}
		if cur == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lease broken; waiting for its expiry to wake the lane: %w", ctx.Err())
		case <-tick.C:
		}
	}
	e, _, err := cl.store.Get(ctx, lane)
	if err != nil {
		return err
	}
	stranded := e.Turn != nil
	if !stranded {
		last, err := cl.res.Inbox.GetLastMsgForSubject(ctx, cl.names.InboxSubject(session.Partition(cl.names.Prefix(), lane), lane))
		stranded = err == nil && (e.InboxID != cl.res.InboxID || last.Sequence > e.CommittedSeq)
	}
	if !stranded {
		return nil
	}
	body, err := json.Marshal(session.Inbound{SessionKey: e.SessionKey, Kind: session.KindInternal, Command: worker.WakeCommand, ReceivedAt: time.Now()})
	if err != nil {
		return err
	}
	msg := nats.NewMsg(cl.names.InboxSubject(session.Partition(cl.names.Prefix(), lane), lane))
	msg.Data = body
	msg.Header.Set(broker.HdrSessionKey, e.SessionKey)
	msg.Header.Set(broker.HdrKind, session.KindInternal)
	_, err = cl.js.PublishMsg(ctx, msg, jetstream.WithMsgID(worker.WakeMsgID(lane, e.CommittedSeq, e.LeaseEpoch)))
	return err
}
