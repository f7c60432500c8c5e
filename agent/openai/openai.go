// Package openai is the agent backend for any server that speaks the OpenAI
// chat-completions API (OpenAI, vLLM, the llama.cpp server, Ollama,
// OpenRouter), on the official OpenAI Go SDK.
//
// Each turn streams the model's answer as deltas; when the model calls
// tools, each call is recorded through the Emitter before it runs and its
// result after, then the model is called again, up to MaxToolSteps times.
// A call that fails with a 429, a 5xx or a connection error is retried with
// backoff within the turn's deadline (the SDK's retries). A cancelled turn
// returns the text streamed so far as its partial reply. The system prompt
// is SystemPrompt, the session context prompt and the turn's notes; the
// history is the session's transcript. Usage is reported for every call,
// with a cost when Prices knows the model.
package openai

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/agent"
)

// Defaults of Config.
const (
	DefaultMaxToolSteps = 8
	DefaultMaxRetries   = 4
)

// Config configures the backend.
type Config struct {
	// Model is the model name. Required.
	Model string
	// BaseURL is the API's base URL, e.g. "http://127.0.0.1:11434/v1".
	// Defaults to the OpenAI API.
	BaseURL string
	// APIKey is sent as a bearer token. It is never logged. Defaults to
	// none (local servers need none).
	APIKey string
	// SystemPrompt opens every turn's system prompt. Defaults to none.
	SystemPrompt string
	// MaxToolSteps bounds the model calls of a turn that may end in tool
	// calls; the call after them is made without tools, so the model
	// answers. Defaults to DefaultMaxToolSteps; negative means none.
	MaxToolSteps int
	// MaxRetries bounds the retries of one model call (429, 5xx, connection
	// errors), with exponential backoff inside the turn's deadline.
	// Defaults to DefaultMaxRetries; negative means none.
	MaxRetries int
	// Tools are offered to the model. Defaults to none. The backend closes
	// them on Close.
	Tools Tools
	// Prices gives the cost of a model's tokens; a model without a price
	// reports cost_status unknown. Defaults to none.
	Prices map[string]Price
	// HTTPClient sends the requests. Defaults to the SDK's client.
	HTTPClient *http.Client
	// Images is how the photos and stickers of a turn's messages reach the
	// model as image parts: ImagesInline (fetched from the attachment URL
	// and sent as data URLs), ImagesURL (the URL itself) or ImagesNone (a
	// text-only model). Every attachment is also described in the message
	// text (kind, name, type, size, URL). Defaults to ImagesInline.
	Images string
	// MaxImageBytes bounds one inlined image. Defaults to
	// DefaultMaxImageBytes.
	MaxImageBytes int64
	// MediaClient fetches inlined images. Defaults to a client with a 30 s
	// timeout.
	MediaClient *http.Client
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Price is a model's price in US dollars per million tokens.
type Price struct {
	Input, Output, CacheRead, CacheWrite float64
}

// Tool is one tool the model may call.
type Tool struct {
	// Name is how the model calls it: [A-Za-z0-9_-], at most 64 bytes.
	Name        string
	Description string
	// Parameters is the JSON schema of the arguments (an object schema).
	Parameters map[string]any
}

// Tools is a set of tools, e.g. the tools of MCP servers (agent/mcp).
type Tools interface {
	// List returns the tools available now.
	List(ctx context.Context) ([]Tool, error)
	// Call runs a tool with the model's JSON arguments and returns the text
	// the model gets back. An error is reported to the model as the
	// result, and the turn goes on.
	Call(ctx context.Context, name, arguments string) (string, error)
	// Close stops what the tools hold (server processes, connections).
	Close() error
}

// Backend is the openai backend; its agents share one client.
type Backend struct {
	cfg    Config
	client openai.Client
	media  *http.Client
	agent  *Agent
}

var _ agent.Backend = (*Backend)(nil)

// New checks cfg and returns the backend.
func New(cfg Config) (*Backend, error) {
	if strings.TrimSpace(cfg.Model) == "" {
		return nil, errors.New("openai: a model is required (agent.openai.model)")
	}
	if cfg.MaxToolSteps == 0 {
		cfg.MaxToolSteps = DefaultMaxToolSteps
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = DefaultMaxRetries
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch cfg.Images {
	case "":
		cfg.Images = ImagesInline
	case ImagesInline, ImagesURL, ImagesNone:
	default:
		return nil, fmt.Errorf("openai: images %q: want %s, %s or %s", cfg.Images, ImagesInline, ImagesURL, ImagesNone)
	}
	if cfg.MaxImageBytes <= 0 {
		cfg.MaxImageBytes = DefaultMaxImageBytes
	}
	opts := []option.RequestOption{option.WithMaxRetries(max(cfg.MaxRetries, 0))}
	if cfg.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(cfg.BaseURL))
	}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	}
	if cfg.HTTPClient != nil {
		opts = append(opts, option.WithHTTPClient(cfg.HTTPClient))
	}
	b := &Backend{cfg: cfg, client: openai.NewClient(opts...), media: cfg.MediaClient}
	if b.media == nil {
		b.media = &http.Client{Timeout: 30 * time.Second}
	}
	b.agent = &Agent{b: b}
	return b, nil
}

// NewAgent implements agent.Backend: the agents are stateless, every turn
// carries its history.
func (b *Backend) NewAgent(context.Context, string, string) (agent.Agent, error) { return b.agent, nil }

// Close closes the tools.
func (b *Backend) Close() error {
	if b.cfg.Tools != nil {
		return b.cfg.Tools.Close()
	}
	return nil
}

// Agent runs turns against the model. It is safe for concurrent use.
type Agent struct {
	b *Backend
}

var _ agent.Agent = (*Agent)(nil)

// Close does nothing: the backend owns the client and the tools.
func (a *Agent) Close() error { return nil }

// Run implements agent.Agent.
func (a *Agent) Run(ctx context.Context, t *agent.Turn, emit agent.Emitter) (*agent.Result, error) {
	cfg := a.b.cfg
	images, failed := a.turnImages(ctx, t)
	msgs := messages(cfg.SystemPrompt, t, images, failed)
	var tools []openai.ChatCompletionToolUnionParam
	if cfg.Tools != nil && cfg.MaxToolSteps > 0 {
		list, err := cfg.Tools.List(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			// The model still answers, without tools; the log says why.
			cfg.Logger.WarnContext(ctx, "tools unavailable for this turn", slog.String("turn_id", t.TurnID), slog.Any("error", err))
		}
		for _, tl := range list {
			tools = append(tools, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
				Name: tl.Name, Description: openai.String(tl.Description), Parameters: tl.Parameters}))
		}
	}
	for step := 0; ; step++ {
		params := openai.ChatCompletionNewParams{
			Model:         cfg.Model,
			Messages:      msgs,
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		}
		if len(tools) > 0 && step < cfg.MaxToolSteps {
			params.Tools = tools
		}
		msg, finish, err := a.tracedCall(ctx, params, emit)
		if err != nil {
			return msg.partial(), err
		}
		if len(msg.toolCalls) == 0 {
			return &agent.Result{Text: msg.text, FinishReason: finish}, nil
		}
		// Text the model wrote before its tool calls goes to the user now.
		if strings.TrimSpace(msg.text) != "" {
			if err := emit.Message(ctx, msg.text); err != nil {
				return nil, err
			}
		}
		calls := make([]openai.ChatCompletionMessageToolCallUnionParam, len(msg.toolCalls))
		for i, c := range msg.toolCalls {
			calls[i] = toolCallParam(c)
		}
		assistant := openai.ChatCompletionAssistantMessageParam{ToolCalls: calls}
		if msg.text != "" {
			assistant.Content.OfString = openai.String(msg.text)
		}
		msgs = append(msgs, openai.ChatCompletionMessageParamUnion{OfAssistant: &assistant})
		for _, c := range msg.toolCalls {
			if err := emit.ToolCall(ctx, c); err != nil {
				return nil, err
			}
			out, err := a.tracedTool(ctx, c)
			if err != nil {
				if ctx.Err() != nil {
					return nil, context.Cause(ctx)
				}
				out = "error: " + err.Error()
			}
			if err := emit.ToolResult(ctx, c.ID, c.Name, out); err != nil {
				return nil, err
			}
			msgs = append(msgs, openai.ToolMessage(out, c.ID))
		}
	}
}

// streamed is what one model call produced.
type streamed struct {
	text      string
	toolCalls []agent.ToolCall
}

func (s streamed) partial() *agent.Result {
	if s.text == "" {
		return nil
	}
	return &agent.Result{Text: s.text, FinishReason: "interrupted"}
}

// tracerName is the instrumentation scope of the backend's spans.
const tracerName = "github.com/agentfleet/agentfleet/agent/openai"

// tracedCall is call inside a span of its own ("chat <model>", as the
// OpenTelemetry GenAI conventions name it), a child of the span ctx holds:
// the caller's tracer provider is used, so a caller that does not trace
// gets a non-recording span.
func (a *Agent) tracedCall(ctx context.Context, params openai.ChatCompletionNewParams, emit agent.Emitter) (streamed, string, error) {
	tracer := trace.SpanFromContext(ctx).TracerProvider().Tracer(tracerName)
	ctx, span := tracer.Start(ctx, "chat "+params.Model, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("gen_ai.operation.name", "chat"), attribute.String("gen_ai.provider.name", "openai"),
			attribute.String("gen_ai.request.model", params.Model), attribute.Int("agentfleet.tools", len(params.Tools))))
	defer span.End()
	rec := &usageRecorder{Emitter: emit}
	out, finish, err := a.call(ctx, params, rec)
	if rec.seen {
		span.SetAttributes(attribute.Int64("gen_ai.usage.input_tokens", rec.u.InputTokens),
			attribute.Int64("gen_ai.usage.output_tokens", rec.u.OutputTokens))
	}
	if finish != "" {
		span.SetAttributes(attribute.StringSlice("gen_ai.response.finish_reasons", []string{finish}))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return out, finish, err
}

// usageRecorder passes everything on and keeps the usage reported.
type usageRecorder struct {
	agent.Emitter
	u    agent.Usage
	seen bool
}

func (r *usageRecorder) Usage(ctx context.Context, u agent.Usage) error {
	r.u, r.seen = u, true
	return r.Emitter.Usage(ctx, u)
}

// tracedTool runs a tool call inside a span ("execute_tool <name>").
func (a *Agent) tracedTool(ctx context.Context, c agent.ToolCall) (string, error) {
	tracer := trace.SpanFromContext(ctx).TracerProvider().Tracer(tracerName)
	ctx, span := tracer.Start(ctx, "execute_tool "+c.Name, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("gen_ai.operation.name", "execute_tool"),
			attribute.String("gen_ai.tool.name", c.Name), attribute.String("gen_ai.tool.call.id", c.ID)))
	defer span.End()
	out, err := a.b.cfg.Tools.Call(ctx, c.Name, c.Arguments)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return out, err
}

// call makes one streaming model call, passing its text on as deltas and
// reporting its usage.
func (a *Agent) call(ctx context.Context, params openai.ChatCompletionNewParams, emit agent.Emitter) (streamed, string, error) {
	stream := a.b.client.Chat.Completions.NewStreaming(ctx, params)
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	var text strings.Builder
	for stream.Next() {
		chunk := stream.Current()
		acc.AddChunk(chunk)
		if len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
			d := chunk.Choices[0].Delta.Content
			text.WriteString(d)
			if err := emit.Delta(ctx, d); err != nil {
				return streamed{text: text.String()}, "", err
			}
		}
	}
	if err := stream.Err(); err != nil {
		if ctx.Err() != nil {
			return streamed{text: text.String()}, "", context.Cause(ctx)
		}
		return streamed{text: text.String()}, "", fmt.Errorf("openai: model %s: %w", params.Model, err)
	}
	if acc.Usage.PromptTokens > 0 || acc.Usage.CompletionTokens > 0 {
		if err := emit.Usage(ctx, a.usage(params.Model, acc.Usage)); err != nil {
			return streamed{}, "", err
		}
	}
	if len(acc.Choices) == 0 {
		return streamed{}, "", fmt.Errorf("openai: model %s answered no choice", params.Model)
	}
	ch := acc.Choices[0]
	out := streamed{text: ch.Message.Content}
	if out.text == "" {
		out.text = text.String()
	}
	for _, c := range ch.Message.ToolCalls {
		if c.ID == "" || c.Function.Name == "" {
			return streamed{}, "", fmt.Errorf("openai: model %s called a tool without an id or a name", params.Model)
		}
		out.toolCalls = append(out.toolCalls, agent.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
	}
	finish := ch.FinishReason
	if finish == "" {
		finish = "stop"
	}
	return out, finish, nil
}

// usage converts a call's usage, with its cost when the model has a price.
func (a *Agent) usage(model string, u openai.CompletionUsage) agent.Usage {
	cached := u.PromptTokensDetails.CachedTokens
	written := u.PromptTokensDetails.CacheWriteTokens
	out := agent.Usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, CacheReadTokens: cached,
		CacheWriteTokens: written, PromptTokens: u.PromptTokens, CostStatus: agent.CostUnknown}
	if p, ok := a.b.cfg.Prices[model]; ok {
		uncached := max(u.PromptTokens-cached-written, 0)
		out.EstimatedCostUSD = (float64(uncached)*p.Input + float64(cached)*p.CacheRead + float64(written)*p.CacheWrite +
			float64(u.CompletionTokens)*p.Output) / 1e6
		out.CostStatus = agent.CostEstimated
	}
	return out
}

func toolCallParam(c agent.ToolCall) openai.ChatCompletionMessageToolCallUnionParam {
	return openai.ChatCompletionMessageToolCallUnionParam{OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
		ID: c.ID, Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Name, Arguments: c.Arguments}}}
}

// Messages builds the chat messages of a turn: the system prompt (system,
// the session context prompt, the turn's notes), then the history. Tool
// results whose call is not in the history are left out, and a call
// without a result (its turn was cut between the two) gets one saying so:
// the API refuses either. A user message's reply context and attachments
// are written into its text; the images of the turn's own messages are
// image parts with their attachment URLs (Run may inline them instead).
func Messages(system string, t *agent.Turn) []openai.ChatCompletionMessageParamUnion {
	images := map[uint64][]string{}
	for _, m := range t.Messages {
		for _, a := range m.Attachments {
			if a.IsImage() && a.URL != "" {
				images[m.InboxSeq] = append(images[m.InboxSeq], a.URL)
			}
		}
	}
	return messages(system, t, images, nil)
}

// messages is Messages with the image parts of each of the turn's
// messages (by inbox seq) given, and the notes of images that failed.
func messages(system string, t *agent.Turn, images, failed map[uint64][]string) []openai.ChatCompletionMessageParamUnion {
	current := map[uint64]agent.UserMessage{}
	for _, m := range t.Messages {
		if m.InboxSeq != 0 {
			current[m.InboxSeq] = m
		}
	}
	var sys []string
	for _, s := range append([]string{system, t.ContextPrompt}, t.Notes...) {
		if s = strings.TrimSpace(s); s != "" {
			sys = append(sys, s)
		}
	}
	var out []openai.ChatCompletionMessageParamUnion
	if len(sys) > 0 {
		out = append(out, openai.SystemMessage(strings.Join(sys, "\n\n")))
	}
	var open []string // calls of the last assistant message still without a result
	closeOpen := func() {
		for _, id := range open {
			out = append(out, openai.ToolMessage("(no result: the call was interrupted)", id))
		}
		open = nil
	}
	for _, m := range t.History {
		switch m.Role {
		case agent.RoleTool:
			i := indexOf(open, m.ToolCallID)
			if i < 0 {
				continue
			}
			open = append(open[:i], open[i+1:]...)
			out = append(out, openai.ToolMessage(m.Content, m.ToolCallID))
			continue
		}
		closeOpen()
		switch m.Role {
		case agent.RoleUser:
			atts, q := m.Attachments, m.Quote
			var imgs, notes []string
			if cur, ok := current[m.InboxSeq]; ok {
				// The turn's own messages: the worker's view of their
				// media fills in, and only they carry image parts
				// (earlier images stay described in the text, not re-sent).
				if len(atts) == 0 {
					atts = cur.Attachments
				}
				if q == nil {
					q = cur.Quote
				}
				imgs, notes = images[m.InboxSeq], failed[m.InboxSeq]
			}
			if len(atts) == 0 && q == nil && len(imgs) == 0 {
				out = append(out, openai.UserMessage(m.Content))
				continue
			}
			out = append(out, userContent(m.Content, q, atts, imgs, notes))
		case agent.RoleSystem:
			out = append(out, openai.SystemMessage(m.Content))
		case agent.RoleAssistant:
			if len(m.ToolCalls) == 0 {
				if m.Content != "" {
					out = append(out, openai.AssistantMessage(m.Content))
				}
				continue
			}
			p := openai.ChatCompletionAssistantMessageParam{}
			if m.Content != "" {
				p.Content.OfString = openai.String(m.Content)
			}
			for _, c := range m.ToolCalls {
				p.ToolCalls = append(p.ToolCalls, toolCallParam(c))
				open = append(open, c.ID)
			}
			out = append(out, openai.ChatCompletionMessageParamUnion{OfAssistant: &p})
		}
	}
	closeOpen()
	return out
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}
