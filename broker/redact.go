package broker

import (
	"net/url"
	"strings"
)

// redactedSecret replaces a secret scrubbed from an error message.
const redactedSecret = "[redacted]"

// secretsOf lists the secrets of cfg that an error might quote: the
// password and token given as options, and those inside its URLs.
func secretsOf(cfg ConnectConfig) []string {
	var out []string
	for _, s := range []string{cfg.Password, cfg.Token} {
		if s != "" {
			out = append(out, s)
		}
	}
	for raw := range strings.SplitSeq(cfg.URL, ",") {
		raw = strings.TrimSpace(raw)
		at := strings.LastIndex(raw, "@")
		if at < 0 {
			continue
		}
		info := raw[:at]
		if _, rest, ok := strings.Cut(info, "://"); ok {
			info = rest
		}
		user, pass, hasPass := strings.Cut(info, ":")
		secret := user // a lone user name is a token
		if hasPass {
			secret = pass
		}
		if secret != "" {
			out = append(out, secret)
			if dec, err := url.PathUnescape(secret); err == nil && dec != secret {
				out = append(out, dec)
			}
		}
	}
	return out
}

// redactErr returns err with every secret in its message replaced by
// "xxxxx" (a URL parse error, for one, quotes the whole URL). errors.Is and
// errors.As still see err.
func redactErr(err error, secrets []string) error {
	msg := err.Error()
	clean := msg
	for _, s := range secrets {
		clean = strings.ReplaceAll(clean, s, redactedSecret)
	}
	if clean == msg {
		return err
	}
	return &redactedError{msg: clean, err: err}
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }

// Unwrap keeps errors.Is and errors.As working; printing the unwrapped
// error would show the secret again, which nothing in this module does.
func (e *redactedError) Unwrap() error { return e.err }
