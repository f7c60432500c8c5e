package discord

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/disgoorg/disgo/httpserver"

	"github.com/agentfleet/agentfleet/ingress"
	"github.com/agentfleet/agentfleet/session"
)

// Interaction types and response types of the interactions API.
const (
	InteractionPing               = 1
	InteractionApplicationCommand = 2
	InteractionComponent          = 3
	InteractionAutocomplete       = 4
	InteractionModalSubmit        = 5

	responsePong            = 1
	responseMessage         = 4
	responseDeferredMessage = 5
	responseAutocomplete    = 8
	flagEphemeral           = 64
)

// AckBudget is how long storing a slash command may take: Discord wants
// the first answer within 3 seconds.
const AckBudget = 2500 * time.Millisecond

// Interaction is the part of an interaction payload the adapter reads.
type Interaction struct {
	ID            string `json:"id"`
	ApplicationID string `json:"application_id"`
	Type          int    `json:"type"`
	Token         string `json:"token"`
	GuildID       string `json:"guild_id,omitempty"`
	ChannelID     string `json:"channel_id,omitempty"`
	Channel       *struct {
		ID       string `json:"id"`
		Type     int    `json:"type"`
		Name     string `json:"name,omitempty"`
		ParentID string `json:"parent_id,omitempty"`
	} `json:"channel,omitempty"`
	Member *struct {
		User *User `json:"user"`
	} `json:"member,omitempty"`
	User *User `json:"user,omitempty"`
	Data *struct {
		Name    string   `json:"name"`
		Type    int      `json:"type"`
		Options []Option `json:"options,omitempty"`
	} `json:"data,omitempty"`
}

// User is an interaction's user.
type User struct {
	ID         string `json:"id"`
	Username   string `json:"username"`
	GlobalName string `json:"global_name,omitempty"`
	Bot        bool   `json:"bot,omitempty"`
}

// Option is a slash command option (sub-commands nest).
type Option struct {
	Name    string          `json:"name"`
	Type    int             `json:"type"`
	Value   json.RawMessage `json:"value,omitempty"`
	Options []Option        `json:"options,omitempty"`
}

// ParseInteraction decodes an interaction. It never panics, whatever data
// holds.
func ParseInteraction(data []byte) (*Interaction, error) {
	var in Interaction
	if err := json.Unmarshal(data, &in); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if in.Type == 0 || in.ID == "" {
		return nil, fmt.Errorf("%w: interaction without type or id", ErrMalformed)
	}
	return &in, nil
}

// CommandMessage turns a slash command interaction into the message to
// publish: "/<name> <option values>" (so /new, /reset, /status and /queue
// are the fleet's commands), from the invoking user, in the channel (DM
// without guild; a thread as its parent's thread). The de-duplication id
// is "discord:<channel>:i<interaction id>".
func CommandMessage(in *Interaction) (ingress.Message, error) {
	if in.Type != InteractionApplicationCommand || in.Data == nil || in.Data.Name == "" {
		return ingress.Message{}, &Skip{"not a slash command"}
	}
	u := in.User
	if in.Member != nil && in.Member.User != nil {
		u = in.Member.User
	}
	if u == nil || u.ID == "" || in.ChannelID == "" {
		return ingress.Message{}, fmt.Errorf("%w: interaction without user or channel", ingress.ErrRejected)
	}
	if u.Bot {
		return ingress.Message{}, &Skip{"sent by a bot"}
	}
	words := []string{"/" + in.Data.Name}
	words = appendOptions(words, in.Data.Options, 0)
	text := strings.Join(words, " ")
	if n := len([]rune(text)); n > MaxTextLength {
		return ingress.Message{}, fmt.Errorf("%w: %w: command of %d characters", ingress.ErrRejected, ingress.ErrTooLarge, n)
	}
	src := session.SessionSource{
		Platform:  session.PlatformDiscord,
		ChatID:    in.ChannelID,
		UserID:    u.ID,
		UserName:  u.GlobalName,
		MessageID: "i" + in.ID,
	}
	if src.UserName == "" {
		src.UserName = u.Username
	}
	if in.GuildID == "" {
		src.ChatType = session.ChatDM
	} else {
		src.ChatType = session.ChatChannel
		src.GuildID = in.GuildID
		if c := in.Channel; c != nil {
			src.ChatName = c.Name
			if isThread(c.Type) && c.ParentID != "" {
				src.ChatID, src.ThreadID, src.ChatTopic, src.ChatName = c.ParentID, in.ChannelID, c.Name, ""
			}
		}
	}
	return ingress.Message{
		Source:  src,
		Text:    text,
		DedupID: ingress.PlatformMsgID(session.PlatformDiscord, in.ChannelID, "i"+in.ID),
	}, nil
}

func isThread(channelType int) bool {
	return channelType == 10 || channelType == 11 || channelType == 12
}

func appendOptions(words []string, opts []Option, depth int) []string {
	if depth > 3 {
		return words
	}
	for _, o := range opts {
		if len(o.Options) > 0 || o.Type == 1 || o.Type == 2 { // sub-command (group)
			words = append(words, o.Name)
			words = appendOptions(words, o.Options, depth+1)
			continue
		}
		var s string
		if json.Unmarshal(o.Value, &s) != nil {
			s = strings.TrimSpace(string(o.Value))
		}
		if s != "" {
			words = append(words, s)
		}
	}
	return words
}

// InteractionsHandler serves POST /webhooks/discord. It refuses to exist
// without the application's public key.
func (a *Adapter) InteractionsHandler() (http.Handler, error) {
	if a.pkey == nil {
		return nil, fmt.Errorf("%w: discord: public_key is empty; refusing to accept unverified interactions", ingress.ErrInvalidConfig)
	}
	return http.HandlerFunc(a.serveInteraction), nil
}

func (a *Adapter) serveInteraction(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "use POST"})
		return
	}
	if r.ContentLength > a.cfg.MaxBodyBytes {
		writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": fmt.Sprintf("body is larger than %d bytes", a.cfg.MaxBodyBytes)})
		return
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(ingress.BodyReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": fmt.Sprintf("body is larger than %d bytes", a.cfg.MaxBodyBytes)})
			return
		}
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "cannot read the body"})
		return
	}
	// Ed25519 over X-Signature-Timestamp + the raw body (disgo's check).
	r.Body = io.NopCloser(bytes.NewReader(body))
	if !httpserver.VerifyRequest(r, a.pkey) {
		a.log.LogAttrs(r.Context(), slog.LevelWarn, "interaction refused: bad signature", slog.String("remote", r.RemoteAddr))
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid request signature"})
		return
	}
	in, err := ParseInteraction(body)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	if a.cfg.ApplicationID != "" && in.ApplicationID != a.cfg.ApplicationID {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "interaction of another application"})
		return
	}
	switch in.Type {
	case InteractionPing:
		writeJSON(w, http.StatusOK, map[string]int{"type": responsePong})
	case InteractionApplicationCommand:
		a.command(w, r.Context(), in)
	case InteractionAutocomplete:
		writeJSON(w, http.StatusOK, map[string]any{"type": responseAutocomplete, "data": map[string]any{"choices": []any{}}})
	default:
		ephemeral(w, "This interaction is not supported.")
	}
}

// command publishes a slash command, records its token for the reply's
// follow-up, and answers with a deferred response (Discord shows "thinking"
// until the follow-up). Discord does not retry interactions: what cannot
// be stored is told to the user at once.
func (a *Adapter) command(w http.ResponseWriter, ctx context.Context, in *Interaction) {
	// Discord invalidates the interaction after 3 s without an answer.
	ctx, cancel := context.WithTimeout(ctx, AckBudget)
	defer cancel()
	m, err := CommandMessage(in)
	var skip *Skip
	switch {
	case errors.As(err, &skip):
		ephemeral(w, "Ignored: "+skip.Reason+".")
		return
	case err != nil:
		ephemeral(w, "Refused: "+err.Error())
		return
	}
	acc, err := a.pub.Publish(ctx, m)
	if err == nil {
		if serr := a.storeInteraction(ctx, acc.SessionKey, in); serr != nil {
			// Stored, but the reply cannot find this interaction: it goes
			// to the channel, and the user is told so instead of waiting.
			a.log.LogAttrs(ctx, slog.LevelWarn, "slash command stored without its follow-up record", slog.Any("error", serr))
			ephemeral(w, "Accepted; the answer will be posted in the channel.")
			return
		}
	}
	if err != nil {
		a.log.LogAttrs(ctx, slog.LevelWarn, "slash command not accepted", slog.String("command", m.Text), slog.Any("error", err))
		if errors.Is(err, ingress.ErrUnavailable) {
			ephemeral(w, "The command could not be stored; please try again.")
		} else {
			ephemeral(w, "Refused: "+err.Error())
		}
		return
	}
	a.log.LogAttrs(ctx, slog.LevelDebug, "slash command accepted", slog.String("command", m.Text),
		slog.String("session_key", acc.SessionKey), slog.Uint64("seq", acc.Seq), slog.Bool("duplicate", acc.Duplicate))
	writeJSON(w, http.StatusOK, map[string]int{"type": responseDeferredMessage})
}

func (a *Adapter) storeInteraction(ctx context.Context, sessionKey string, in *Interaction) error {
	data, _ := json.Marshal(interactionRecord{ApplicationID: in.ApplicationID, Token: in.Token,
		Expires: time.Now().Add(InteractionTTL - time.Minute)})
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if _, err := a.res.Delivered.Put(pctx, InteractionKey(sessionKey), data); err != nil {
		return fmt.Errorf("%w: interaction record: %w", ingress.ErrUnavailable, err)
	}
	return nil
}

func ephemeral(w http.ResponseWriter, text string) {
	writeJSON(w, http.StatusOK, map[string]any{"type": responseMessage, "data": map[string]any{"content": text, "flags": flagEphemeral}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}
