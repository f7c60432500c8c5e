// Package session is the pure domain of agentfleet's session lifecycle: where
// a message came from (SessionSource), the per-lane record (SessionEntry),
// session ids, session keys, lane tokens and partitions, the reset policy,
// the get_or_create decision, and the session context prompt with its PII
// redaction.
//
// Nothing here talks to NATS, a clock or the network. Every function takes
// the time it needs as an argument, so callers (the ingress, the worker, the
// expiry watcher, fleetctl) get the same answers for the same inputs. The
// only I/O is WhatsAppResolver reading the WhatsApp bridge's alias mapping
// files.
//
// A message flows through the package like this:
//
//	src := session.SessionSource{Platform: session.PlatformTelegram, ChatType: "group",
//		ChatID: "-100123", UserID: "42", UserName: "Alice"}
//	src.Normalize()
//	if err := src.Validate(); err != nil {
//		return err // reject with 4xx; nothing is published
//	}
//	key := session.BuildSessionKey(src, session.DefaultKeyOptions()) // agent:main:telegram:group:-100123:42
//	lane := session.LaneToken(key)                                  // agent.main.telegram.group.-100123.42
//	p := session.Partition("fleet", lane)                           // inbox subject fleet.in.<p>.<lane>
//
// and, when the owner of the lane records a turn's intent:
//
//	policy := resetConfig.PolicyFor(entry.Platform, entry.ChatType)
//	d := session.Decide(entry, policy, now, loc, freshness, nil)
//	if d.Reset { /* new session d.SessionID, reason d.Reason, linked to d.PreviousSessionID */ }
//
// # Session keys
//
// A session key is agent:main:{platform}:{chat_type}[:{chat_id}][:{thread_id}][:{participant_id}]
// (seeds/session-lifecycle.md §4). DMs are isolated per chat id, falling back
// to the participant (user_id_alt, then user_id), then to one shared session
// per platform. Groups and channels append the participant when per-user
// isolation applies: GroupSessionsPerUser outside threads (default true),
// ThreadSessionsPerUser inside them (default false). WhatsApp DM chat ids and
// group participants are canonicalized so JID/LID alias flips of one person
// never split a conversation. Keys always use raw identifiers; redaction only
// ever applies to the context prompt.
//
// # Lane tokens
//
// A lane token is the session key written as NATS subject tokens: the key is
// split on ':', every byte outside [A-Za-z0-9_-] (including '=') becomes '='
// followed by two upper-case hex digits, an empty segment becomes a lone '=',
// and the segments are joined with '.'. The mapping is reversible
// (ParseLaneToken) and the token is also a valid KV key.
package session
