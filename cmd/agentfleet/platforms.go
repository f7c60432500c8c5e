package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/broker"
	"github.com/agentfleet/agentfleet/config"
	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/ingress/discord"
	"github.com/agentfleet/agentfleet/ingress/slack"
	"github.com/agentfleet/agentfleet/ingress/telegram"
	"github.com/agentfleet/agentfleet/ingress/whatsapp"
)

// platforms are the chat-platform adapters a process runs.
type platforms struct {
	// routes are the webhook handlers, by path.
	routes     map[string]http.Handler
	deliveries []*ingress.PlatformDelivery
}

// stop stops the delivery consumers (the poll loops end with ctx).
func (p *platforms) stop() {
	for _, d := range p.deliveries {
		d.Stop()
	}
}

// handler serves the webhooks beside next (the HTTP adapter).
func (p *platforms) handler(next http.Handler) http.Handler {
	if len(p.routes) == 0 {
		return next
	}
	mux := http.NewServeMux()
	for path, h := range p.routes {
		mux.Handle(path, h) // the adapter answers 405 to other methods
	}
	mux.Handle("/", next)
	return mux
}

// startPlatforms starts what the configuration turns on: for Telegram the
// webhook route or the poll loop (one per bot across the fleet, under a
// singleton lease), for Slack the Events API route and/or the Socket Mode
// connection (one per app, under a singleton lease), for WhatsApp the
// webhook route, for Discord the Gateway connection (one per bot, under a
// singleton lease) and the interactions route, and each platform's
// delivery consumer.
func (rt *runtime) startPlatforms(ctx context.Context, js jetstream.JetStream, res *broker.Resources, pub *ingress.Publisher, wg *sync.WaitGroup) (*platforms, error) {
	p := &platforms{routes: map[string]http.Handler{}}
	tg := rt.cfg.Telegram()
	if tg.Token != "" {
		a, err := telegram.New(pub, telegram.Config{Token: tg.Token, WebhookSecret: tg.WebhookSecret, APIBase: tg.APIBase,
			MaxBodyBytes: int64(rt.cfg.HTTP.MaxBodyBytes), MediaBaseURL: rt.cfg.HTTP.PublicBaseURL(), Logger: rt.log})
		if err != nil {
			return nil, err
		}
		mh, err := a.MediaHandler(0)
		if err != nil {
			return nil, err
		}
		p.routes[ingress.MediaPathPrefix+"telegram/"] = mh
		switch tg.Mode {
		case config.TelegramModePoll:
			s, err := ingress.NewSingleton(js, res, ingress.SingletonConfig{Names: rt.names, Kind: "telegram_poll",
				ID: ingress.TokenID(tg.Token), Logger: rt.log})
			if err != nil {
				return nil, err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = s.Run(ctx, a.Poll)
			}()
			rt.log.Info("telegram polling enabled", slog.String("lease", s.Key()))
		default:
			h, err := a.WebhookHandler()
			if err != nil {
				return nil, fmt.Errorf("platforms.telegram: %w", err)
			}
			p.routes["/webhooks/telegram"] = h
			rt.log.Info("telegram webhook enabled", slog.String("path", "/webhooks/telegram"))
		}
		cfg := telegram.DeliveryConfig(a.Sender())
		cfg.LiveEdits = tg.LiveEdits
		if err := p.startDelivery(ctx, rt, js, res, cfg); err != nil {
			p.stop()
			return nil, err
		}
		if tg.LiveEdits {
			if err := rt.startLive(ctx, js, res, telegram.LiveConfig(a.Sender()), ingress.TokenID(tg.Token), wg); err != nil {
				p.stop()
				return nil, err
			}
		}
	}
	sl := rt.cfg.Slack()
	if sl.Enabled() {
		media := ""
		if sl.BotToken != "" {
			media = rt.cfg.HTTP.PublicBaseURL()
		}
		a, err := slack.New(pub, slack.Config{SigningSecret: sl.SigningSecret, BotToken: sl.BotToken, APIBase: sl.APIBase,
			RequireMention: sl.RequireMention, MaxBodyBytes: int64(rt.cfg.HTTP.MaxBodyBytes), MediaBaseURL: media,
			Logger: rt.log})
		if err != nil {
			p.stop()
			return nil, fmt.Errorf("platforms.slack: %w", err)
		}
		if media != "" {
			mh, err := a.MediaHandler(0)
			if err != nil {
				p.stop()
				return nil, fmt.Errorf("platforms.slack: %w", err)
			}
			p.routes[ingress.MediaPathPrefix+"slack/"] = mh
		}
		if sl.SigningSecret != "" {
			h, err := a.Handler()
			if err != nil {
				p.stop()
				return nil, err
			}
			p.routes["/webhooks/slack"] = h
			rt.log.Info("slack events endpoint enabled", slog.String("path", "/webhooks/slack"))
		}
		if sl.Mode == config.SlackModeSocket {
			s, err := ingress.NewSingleton(js, res, ingress.SingletonConfig{Names: rt.names, Kind: "slack_socket",
				ID: ingress.TokenID(sl.AppToken), Logger: rt.log})
			if err != nil {
				p.stop()
				return nil, err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = s.Run(ctx, func(ctx context.Context) error { return a.SocketMode(ctx, sl.AppToken) })
			}()
			rt.log.Info("slack socket mode enabled", slog.String("lease", s.Key()))
		}
		scfg := slack.DeliveryConfig(a.Sender())
		scfg.LiveEdits = sl.LiveEdits
		if err := p.startDelivery(ctx, rt, js, res, scfg); err != nil {
			p.stop()
			return nil, err
		}
		if sl.LiveEdits {
			if err := rt.startLive(ctx, js, res, slack.LiveConfig(a.Sender()), ingress.TokenID(sl.BotToken), wg); err != nil {
				p.stop()
				return nil, err
			}
		}
	}
	if wa := rt.cfg.WhatsAppCloud(); wa.Enabled() {
		a, err := whatsapp.New(pub, js, res, whatsapp.Config{AppSecret: wa.AppSecret, VerifyToken: wa.VerifyToken,
			AccessToken: wa.AccessToken, PhoneNumberID: wa.PhoneNumberID, APIBase: wa.APIBase,
			MaxBodyBytes: int64(rt.cfg.HTTP.MaxBodyBytes), MediaBaseURL: rt.cfg.HTTP.PublicBaseURL(), Logger: rt.log})
		if err != nil {
			p.stop()
			return nil, fmt.Errorf("platforms.whatsapp: %w", err)
		}
		if wa.AccessToken != "" {
			mh, err := a.MediaHandler(0)
			if err != nil {
				p.stop()
				return nil, fmt.Errorf("platforms.whatsapp: %w", err)
			}
			p.routes[ingress.MediaPathPrefix+"whatsapp/"] = mh
		}
		h, err := a.Handler()
		if err != nil {
			p.stop()
			return nil, fmt.Errorf("platforms.whatsapp: %w", err)
		}
		p.routes["/webhooks/whatsapp"] = h
		rt.log.Info("whatsapp webhook enabled", slog.String("path", "/webhooks/whatsapp"))
		if err := p.startDelivery(ctx, rt, js, res, whatsapp.DeliveryConfig(a.Sender())); err != nil {
			p.stop()
			return nil, err
		}
	}
	if dc := rt.cfg.Discord(); dc.Token != "" {
		a, err := discord.New(pub, res, discord.Config{Token: dc.Token, PublicKey: dc.PublicKey, ApplicationID: dc.ApplicationID,
			APIBase: dc.APIBase, GatewayURL: dc.GatewayURL, RequireMention: dc.RequireMention,
			MaxBodyBytes: int64(rt.cfg.HTTP.MaxBodyBytes), Logger: rt.log})
		if err != nil {
			p.stop()
			return nil, fmt.Errorf("platforms.discord: %w", err)
		}
		if dc.PublicKey != "" {
			h, err := a.InteractionsHandler()
			if err != nil {
				p.stop()
				return nil, fmt.Errorf("platforms.discord: %w", err)
			}
			p.routes["/webhooks/discord"] = h
			rt.log.Info("discord interactions endpoint enabled", slog.String("path", "/webhooks/discord"))
		}
		s, err := ingress.NewSingleton(js, res, ingress.SingletonConfig{Names: rt.names, Kind: "discord_gateway",
			ID: ingress.TokenID(dc.Token), Logger: rt.log})
		if err != nil {
			p.stop()
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.Run(ctx, a.Gateway)
		}()
		rt.log.Info("discord gateway enabled", slog.String("lease", s.Key()))
		if err := p.startDelivery(ctx, rt, js, res, discord.DeliveryConfig(a.Sender())); err != nil {
			p.stop()
			return nil, err
		}
	}
	return p, nil
}

func (p *platforms) startDelivery(ctx context.Context, rt *runtime, js jetstream.JetStream, res *broker.Resources, cfg ingress.PlatformDeliveryConfig) error {
	cfg.Names = rt.names
	cfg.Logger = rt.log
	cfg.Backoff = rt.cfg.Delivery.Backoff.Duration()
	cfg.MaxAttempts = rt.cfg.Delivery.MaxAttempts
	cfg.MaxAge = rt.cfg.Delivery.MaxAge.Duration()
	cfg.Metrics = rt.instruments()
	cfg.TracerProvider = rt.tracer()
	d, err := ingress.NewPlatformDelivery(js, res, cfg)
	if err != nil {
		return err
	}
	if err := d.Start(ctx); err != nil {
		return err
	}
	p.deliveries = append(p.deliveries, d)
	return nil
}

// startLive runs the platform's live messages (streamed deltas edited into
// one message) in one process of the fleet: under a singleton lease, as
// the poll loop. The delivery consumer, in any process, finds the live
// message in the delivered bucket.
func (rt *runtime) startLive(ctx context.Context, js jetstream.JetStream, res *broker.Resources, cfg ingress.LiveEditsConfig, id string, wg *sync.WaitGroup) error {
	if cfg.Sender == nil {
		return nil
	}
	cfg.Names = rt.names
	cfg.Logger = rt.log
	l, err := ingress.NewLiveEdits(js, res, cfg)
	if err != nil {
		return err
	}
	s, err := ingress.NewSingleton(js, res, ingress.SingletonConfig{Names: rt.names, Kind: string(cfg.Platform) + "_live",
		ID: id, Logger: rt.log})
	if err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = s.Run(ctx, l.Run)
	}()
	return nil
}
