package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/config"
)

// TestNATSURLVariables: AGENTFLEET_NATS_URL is honoured, wins over NATS_URL
// when both are set, NATS_URL alone still works, a flag wins over both, and
// either variable wins over the file.
func TestNATSURLVariables(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "nats:\n  url: nats://file:4222\n")
	for _, tc := range []struct {
		name      string
		env       map[string]string
		flag      string
		want, src string
	}{
		{"AGENTFLEET_NATS_URL alone", map[string]string{"AGENTFLEET_NATS_URL": "nats://af:4222"}, "", "nats://af:4222", "AGENTFLEET_NATS_URL"},
		{"NATS_URL alone", map[string]string{"NATS_URL": "nats://plain:4222"}, "", "nats://plain:4222", "NATS_URL"},
		{"both: the specific one wins", map[string]string{"AGENTFLEET_NATS_URL": "nats://af:4222", "NATS_URL": "nats://plain:4222"}, "", "nats://af:4222", "AGENTFLEET_NATS_URL"},
		{"empty AGENTFLEET_NATS_URL counts as unset", map[string]string{"AGENTFLEET_NATS_URL": "", "NATS_URL": "nats://plain:4222"}, "", "nats://plain:4222", "NATS_URL"},
		{"flag over both", map[string]string{"AGENTFLEET_NATS_URL": "nats://af:4222", "NATS_URL": "nats://plain:4222"}, "nats://flag:4222", "nats://flag:4222", "flag --nats-url"},
		{"no variable: the file", nil, "", "nats://file:4222", file + ":2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var over []config.Override
			if tc.flag != "" {
				over = append(over, config.Override{Path: "nats.url", Value: tc.flag, Source: "flag --nats-url"})
			}
			c, src, err := config.LoadSourced(file, envOf(tc.env), over)
			if err != nil {
				t.Fatal(err)
			}
			if c.NATS.URL != tc.want || src.Of("nats.url") != tc.src {
				t.Errorf("nats.url = %q from %q, want %q from %q", c.NATS.URL, src.Of("nats.url"), tc.want, tc.src)
			}
		})
	}
	// A bad AGENTFLEET_NATS_URL is refused naming it.
	_, err := config.Load("", envOf(map[string]string{"AGENTFLEET_NATS_URL": "http://x:1", "NATS_URL": "nats://ok:4222"}))
	if err == nil || !strings.Contains(err.Error(), "AGENTFLEET_NATS_URL") {
		t.Fatalf("bad AGENTFLEET_NATS_URL: %v", err)
	}
}

func TestSource(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "worker:\n  lanes: 8\n")
	_, src, err := config.LoadSourced(file, envOf(map[string]string{"AGENTFLEET_LEASE_TTL": "20s"}),
		[]config.Override{{Path: "http.addr", Value: "127.0.0.1:1", Source: "flag --http"}})
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"worker.lanes": file + ":2", "lease.ttl": "AGENTFLEET_LEASE_TTL", "http.addr": "flag --http", "worker.turns": "",
	} {
		if got := src.Of(path); got != want {
			t.Errorf("Source(%s) = %q, want %q", path, got, want)
		}
	}
}

func TestCheckHTTP(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr, token string
		allow       bool
		ok          bool
	}{
		{config.DefaultHTTPAddr, "", false, true},
		{"127.0.0.1:0", "", false, true},
		{"localhost:8080", "", false, true},
		{"[::1]:8080", "", false, true},
		{":8080", "", false, false},
		{"0.0.0.0:8080", "", false, false},
		{"[::]:8080", "", false, false},
		{"192.168.1.10:8080", "", false, false},
		{"example.com:8080", "", false, false},
		{":8080", "s3cret", false, true},
		{":8080", "", true, true},
	} {
		c := config.Default()
		c.HTTP.Addr, c.HTTP.Token, c.HTTP.AllowUnauthenticated = tc.addr, tc.token, tc.allow
		err := c.CheckHTTP(nil)
		if (err == nil) != tc.ok {
			t.Errorf("addr %q token %q allow %v: CheckHTTP = %v, want ok=%v", tc.addr, tc.token, tc.allow, err, tc.ok)
		}
		if err != nil {
			var fe *config.FieldError
			if !errors.As(err, &fe) || fe.Field != "http.addr" || !strings.Contains(err.Error(), "http.token") ||
				!strings.Contains(err.Error(), "allow_unauthenticated") {
				t.Errorf("CheckHTTP(%q) error does not say what to do: %v", tc.addr, err)
			}
		}
	}
	// The refusal names where the address came from.
	c, src, err := config.LoadSourced("", envOf(map[string]string{"AGENTFLEET_HTTP_ADDR": ":9090"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckHTTP(src); err == nil || !strings.Contains(err.Error(), "AGENTFLEET_HTTP_ADDR") {
		t.Fatalf("CheckHTTP: %v, want the variable named", err)
	}
	// Validate alone (every role) does not refuse it: a worker sharing the
	// file serves no HTTP.
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestCheckUp(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "nats:\n  replicas: 3\n")
	c, src, err := config.LoadSourced(file, nil, nil)
	if err != nil {
		t.Fatalf("replicas 3 is a valid fleet setting: %v", err)
	}
	err = c.CheckUp(src)
	if err == nil {
		t.Fatal("up accepted nats.replicas 3")
	}
	for _, want := range []string{"nats.replicas", `"3"`, "embedded", file + ":2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Count(err.Error(), "\n") != 0 {
		t.Errorf("one problem, one line: %q", err)
	}
	if err := config.Default().CheckUp(nil); err != nil {
		t.Fatalf("the defaults do not suit up: %v", err)
	}
}
