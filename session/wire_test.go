package session_test

import (
	"testing"

	"github.com/agentfleet/agentfleet/session"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		text, kind, command, args string
	}{
		{"hello", session.KindMessage, "", ""},
		{"  /queue  do it later ", session.KindQueue, "queue", "do it later"},
		{"/q a\n!sleep 1s", session.KindQueue, "queue", "a\n!sleep 1s"},
		{"/q\nnext line", session.KindQueue, "queue", "next line"},
		{"/busy\tqueue", session.KindCommand, "busy", "queue"},
		{"/STOP", session.KindCommand, "stop", ""},
		{"/new@mybot Project X", session.KindCommand, "new", "Project X"},
		{"/queue", session.KindQueue, "queue", ""},
		{"/unknown thing", session.KindMessage, "", ""},
		{"/", session.KindMessage, "", ""},
		{"not /stop", session.KindMessage, "", ""},
	} {
		kind, command, args := session.Classify(tc.text)
		if kind != tc.kind || command != tc.command || args != tc.args {
			t.Errorf("Classify(%q) = %q, %q, %q; want %q, %q, %q", tc.text, kind, command, args, tc.kind, tc.command, tc.args)
		}
	}
}
