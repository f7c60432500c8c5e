package slack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	slackapi "github.com/slack-go/slack"
	"github.com/slack-go/slack/socketmode"

	"github.com/agentfleet/agentfleet/ingress"
)

// SocketMode receives events over Slack's Socket Mode (a WebSocket the
// app opens with its app-level token, for deployments without a public
// URL) until ctx ends. Run it under an ingress.Singleton, so that one
// process per app holds the connection fleet-wide.
//
// Each events_api envelope goes through the same path as an Events API
// request (ParseEvent, ToMessage, Publish) and is acknowledged only after
// it was stored, skipped or refused for good: an envelope the inbox cannot
// store now is left unacknowledged, and Slack delivers it again (to this
// connection or, after a takeover, to the next holder's). The request
// signature is not checked: the connection itself is authenticated by the
// app-level token.
//
// The connection comes from slack-go's socketmode package (apps.connections.open,
// the WebSocket, hello/disconnect handling, reconnects and acks).
func (a *Adapter) SocketMode(ctx context.Context, appToken string) error {
	if appToken == "" {
		return fmt.Errorf("%w: slack socket mode: app-level token is empty", ingress.ErrInvalidConfig)
	}
	log := a.log.With(slog.String("mode", "socket"))
	api := slackapi.New(a.cfg.BotToken, slackapi.OptionAPIURL(a.cfg.APIBase), slackapi.OptionAppLevelToken(appToken),
		slackapi.OptionHTTPClient(a.cfg.HTTPClient))
	client := socketmode.New(api)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- client.RunContext(rctx) }()
	for {
		select {
		case <-ctx.Done():
			cancel()
			<-runErr
			log.LogAttrs(context.WithoutCancel(ctx), slog.LevelInfo, "socket mode stopped")
			return nil
		case err := <-runErr:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("slack socket mode: %w", err)
		case evt := <-client.Events:
			switch evt.Type {
			case socketmode.EventTypeConnected:
				log.LogAttrs(ctx, slog.LevelInfo, "socket mode connected")
			case socketmode.EventTypeConnectionError, socketmode.EventTypeIncomingError, socketmode.EventTypeErrorWriteFailed:
				log.LogAttrs(ctx, slog.LevelWarn, "socket mode connection trouble", slog.String("event", string(evt.Type)), slog.Any("data", evt.Data))
			case socketmode.EventTypeInvalidAuth:
				log.LogAttrs(ctx, slog.LevelError, "socket mode: the app-level token is refused")
			case socketmode.EventTypeEventsAPI:
				a.socketEvent(ctx, log, client, evt)
			case socketmode.EventTypeInteractive, socketmode.EventTypeSlashCommand:
				// Not handled, but acknowledged so Slack does not retry.
				if evt.Request != nil {
					_ = client.Ack(*evt.Request)
				}
			}
		}
	}
}

// socketEvent publishes one events_api envelope and acknowledges it,
// unless it could not be stored.
func (a *Adapter) socketEvent(ctx context.Context, log *slog.Logger, client *socketmode.Client, evt socketmode.Event) {
	if evt.Request == nil {
		return
	}
	req := *evt.Request
	ev, err := ParseEvent(req.Payload)
	if err == nil {
		var res ingress.Accepted
		res, err = a.handle(context.WithoutCancel(ctx), ev)
		if err == nil {
			log.LogAttrs(ctx, slog.LevelDebug, "event accepted", slog.String("event_id", ev.EventID),
				slog.Int("retry_attempt", req.RetryAttempt), slog.String("session_key", res.SessionKey),
				slog.Uint64("seq", res.Seq), slog.Bool("duplicate", res.Duplicate))
		}
	}
	var skip *Skip
	switch {
	case err == nil, errors.As(err, &skip):
	case errors.Is(err, ingress.ErrUnavailable):
		log.LogAttrs(ctx, slog.LevelWarn, "event not stored; Slack will deliver it again", slog.String("envelope_id", req.EnvelopeID), slog.Any("error", err))
		return
	default:
		log.LogAttrs(ctx, slog.LevelWarn, "event refused", slog.String("envelope_id", req.EnvelopeID), slog.Any("error", err))
	}
	if err := client.Ack(req); err != nil {
		log.LogAttrs(ctx, slog.LevelWarn, "socket mode ack failed; Slack will deliver the event again", slog.Any("error", err))
	}
}
