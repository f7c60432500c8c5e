package statedb_test

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/statedb"
)

func TestAPIServiceEndpoints(t *testing.T) {
	t.Parallel()
	f := startFleet(t)
	ids := writeStory(t, f)
	db := openTemp(t)
	runIndexer(t, f, db, "api")
	waitIndexed(t, f, db)
	api, err := statedb.StartAPI(f.nc, db, f.names, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer api.Stop()
	client := f.srv.Connect(t)

	// Discovery: $SRV.PING and $SRV.INFO, as `nats micro ls` and `info` do.
	subj, err := micro.ControlSubject(micro.InfoVerb, f.names.APIService(), "")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := client.Request(subj, nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatal(err)
	}
	var subjects []string
	for _, e := range info.Endpoints {
		subjects = append(subjects, e.Subject)
	}
	sort.Strings(subjects)
	want := []string{"fleet.api.export", "fleet.api.search", "fleet.api.session", "fleet.api.sessions", "fleet.api.stats", "fleet.api.transcript"}
	if info.Name != "fleet_api" || strings.Join(subjects, ",") != strings.Join(want, ",") {
		t.Fatalf("info %s %v", info.Name, subjects)
	}
	ping, _ := micro.ControlSubject(micro.PingVerb, "", "")
	if _, err := client.Request(ping, nil, 10*time.Second); err != nil {
		t.Fatalf("ping: %v", err)
	}

	call := func(ep string, req any, resp any) (code string) {
		t.Helper()
		data, _ := json.Marshal(req)
		m, err := client.Request(f.names.APISubject(ep), data, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if c := m.Header.Get(micro.ErrorCodeHeader); c != "" {
			return c
		}
		if err := json.Unmarshal(m.Data, resp); err != nil {
			t.Fatalf("%s: %v: %s", ep, err, m.Data)
		}
		return ""
	}
	var sr statedb.SearchResponse
	if c := call("search", statedb.SearchRequest{Query: "migration", Roles: []string{"assistant"}}, &sr); c != "" || len(sr.Results) != 1 ||
		!strings.Contains(sr.Results[0].Snippet, ">>>migration<<<") || len(sr.Results[0].Context) != 2 {
		t.Fatalf("search %s %+v", c, sr)
	}
	if c := call("search", statedb.SearchRequest{}, &sr); c != "400" {
		t.Fatalf("empty search: %q", c)
	}
	if c := call("search", "not an object", &sr); c != "400" {
		t.Fatalf("bad body: %q", c)
	}
	var ls statedb.SessionsResponse
	if c := call("sessions", statedb.SessionsRequest{}, &ls); c != "" || len(ls.Sessions) != 3 || ls.Sessions[0].ID != ids.s3 || ls.Sessions[0].Preview == "" {
		t.Fatalf("sessions %s %+v", c, ls)
	}
	if c := call("sessions", statedb.SessionsRequest{Source: "telegram", ActiveOnly: true}, &ls); c != "" || len(ls.Sessions) != 1 || ls.Sessions[0].ID != ids.s1 {
		t.Fatalf("active telegram sessions %s %+v", c, ls)
	}
	var ss statedb.SessionResponse
	if c := call("session", statedb.SessionRequest{Title: "Project #2"}, &ss); c != "" || ss.Session.ID != ids.s2 || len(ss.Ancestors) != 2 {
		t.Fatalf("session %s %+v", c, ss)
	}
	if c := call("session", statedb.SessionRequest{ID: "20200101_000000_deadbeef"}, &ss); c != "404" {
		t.Fatalf("unknown session: %q", c)
	}
	var tr statedb.TranscriptResponse
	if c := call("transcript", statedb.SessionRequest{ID: ids.s1}, &tr); c != "" || len(tr.Messages) != 5 {
		t.Fatalf("transcript %s %+v", c, tr)
	}
	var st statedb.Stats
	if c := call("stats", nil, &st); c != "" || st.Sessions != 3 || st.InputTokens != 120 {
		t.Fatalf("stats %s %+v", c, st)
	}
	var ex statedb.ExportResponse
	if c := call("export", statedb.ExportRequest{ID: ids.s2}, &ex); c != "" || len(ex.Sessions) != 1 || ex.Sessions[0].ID != ids.s2 {
		t.Fatalf("export one %s %+v", c, ex)
	}
	// Export all, page by page.
	var got []string
	for off := 0; ; {
		var page statedb.ExportResponse
		if c := call("export", statedb.ExportRequest{All: true, Offset: off, Limit: 2}, &page); c != "" {
			t.Fatalf("export page: %s", c)
		}
		for _, s := range page.Sessions {
			got = append(got, s.ID)
		}
		if page.Next == 0 {
			break
		}
		off = page.Next
	}
	if strings.Join(got, ",") != strings.Join([]string{ids.s1, ids.s2, ids.s3}, ",") {
		t.Fatalf("export all: %v", got)
	}
	if c := call("export", statedb.ExportRequest{}, &ex); c != "400" {
		t.Fatalf("export without id: %q", c)
	}
}
