package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/agentfleet/agentfleet/admin"
)

// leaseDoc is what a lane's lease key holds, as fleetctl reports it.
type leaseDoc = admin.Lease

// readLease reads the lane's live lease, or nil when no lease is held.
func readLease(ctx context.Context, cl *client, lane string) (*leaseDoc, error) {
	return cl.fl.ReadLease(ctx, lane)
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
					e, rev, err := getEntry(ctx, cl, lane, c.Args().First())
					if err != nil {
						return err
					}
					lease, err := readLease(ctx, cl, lane)
					if err != nil {
						return err
					}
					after := uint64(0)
					if e.InboxID == cl.res.Inboxes.ForLane(lane).ID {
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

func breakLease(ctx context.Context, cl *client, lane string) (*leaseDoc, error) {
	return cl.fl.BreakLease(ctx, lane)
}
