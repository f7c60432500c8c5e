package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestUpServesConsole: `agentfleet up` serves the operations console at
// /console on its HTTP address, behind the HTTP API's token, and the
// console shows the lane a message made.
func TestUpServesConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: multi-process tests are skipped under -short")
	}
	t.Parallel()
	dir := t.TempDir()
	addr := freeAddr(t)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	const token = "e2e-console-token"
	up := newProc(t, dir, "up", []string{"AGENTFLEET_SESSION_RESET_MODE=none", "AGENTFLEET_HTTP_TOKEN=" + token},
		"up", "--data", dir+"/data", "--http", addr)
	up.start()
	waitReady(t, hc, "http://"+addr, up)

	body, _ := json.Marshal(map[string]string{"chat_id": "console-1", "text": "hello console"})
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/messages", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST: %s", resp.Status)
	}

	resp, err = hc.Get("http://" + addr + "/console/lanes")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/console/login") {
		t.Fatalf("console without the token: %s to %q", resp.Status, resp.Header.Get("Location"))
	}
	waitFor(t, 60*time.Second, "the console to show the lane idle", func() error {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/console/lanes?state=idle", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "agent:main:http:dm:console-1") {
			return fmt.Errorf("%s", resp.Status)
		}
		return nil
	})
}
