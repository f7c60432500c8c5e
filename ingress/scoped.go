package ingress

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// scopedTokenFile is one entry of a scoped-tokens file.
type scopedTokenFile struct {
	Token       string   `json:"token"`
	KeyPrefixes []string `json:"key_prefixes"`
}

// LoadScopedTokens reads a JSON array of {"token", "key_prefixes"} objects
// (unknown fields refused). The tokens are secrets: errors name an entry by
// its index, never by its token. New checks each entry.
func LoadScopedTokens(path string) ([]ScopedToken, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("scoped tokens: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var entries []scopedTokenFile
	if err := dec.Decode(&entries); err != nil {
		return nil, fmt.Errorf("scoped tokens file %s: %w", path, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("scoped tokens file %s: data after the array", path)
	}
	out := make([]ScopedToken, 0, len(entries))
	for _, e := range entries {
		out = append(out, ScopedToken(e))
	}
	if _, err := (Config{ScopedTokens: out}).withDefaults(); err != nil {
		return nil, fmt.Errorf("scoped tokens file %s: %w", path, err)
	}
	return out, nil
}
