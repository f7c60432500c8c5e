package broker_test

import (
	"reflect"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/broker"
)

// TestNewMsgIsNewMsgAndSet checks that broker.NewMsg builds the message
// nats.NewMsg and Header.Set build, and that the headers it shares one
// allocation between stay apart when one of them is added to.
func TestNewMsgIsNewMsgAndSet(t *testing.T) {
	for _, hdrs := range [][]string{
		nil,
		{broker.HdrSessionKey, "k"},
		{broker.HdrEntryID, "e1", broker.HdrSessionID, "s1", "Nats-Expected-Last-Subject-Sequence", "0", broker.HdrMsgID, "e1"},
	} {
		want := nats.NewMsg("a.b")
		want.Data = []byte("data")
		for i := 0; i+1 < len(hdrs); i += 2 {
			want.Header.Set(hdrs[i], hdrs[i+1])
		}
		got := broker.NewMsg("a.b", []byte("data"), hdrs...)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("headers %q: got %#v, want %#v", hdrs, got, want)
		}
		if len(hdrs) >= 4 {
			got.Header.Add(hdrs[0], "more")
			if v := got.Header.Values(hdrs[2]); len(v) != 1 || v[0] != hdrs[3] {
				t.Fatalf("adding to %s changed %s: %q", hdrs[0], hdrs[2], v)
			}
		}
	}
}
