package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"go.yaml.in/yaml/v3"
)

// ServerUser is a user of the embedded server: a name and a password
// (plain or a bcrypt hash, "$2a$..."), or an nkey public key ("U..."), and
// the role whose permissions it gets.
type ServerUser struct {
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// PasswordEnv names an environment variable holding the password
	// (plain or bcrypt): LoadUsers reads it into Password, so a users file
	// can be shared (in a repository, a container image) without secrets.
	PasswordEnv string `yaml:"password_env"`
	NKey        string `yaml:"nkey"`
	Role        string `yaml:"role"`
	// InboxPrefix is the prefix of the user's reply subjects, as its
	// processes set it in nats.inbox_prefix. Empty: "_INBOX".
	InboxPrefix string `yaml:"inbox_prefix"`
}

// SystemAccount is the name of the embedded server's system account, which
// users of RoleSystem join.
const SystemAccount = "SYS"

// LoadUsers reads a users file: YAML with a list under "users", each with
// user and password (or password_env, the name of an environment variable
// holding it), or nkey, and a role. Unknown keys are refused.
func LoadUsers(path string) ([]ServerUser, error) {
	return LoadUsersEnv(path, os.LookupEnv)
}

// LoadUsersEnv is LoadUsers reading password_env variables through lookup.
// A variable that is unset or empty is an error naming it.
func LoadUsersEnv(path string, lookup func(string) (string, bool)) ([]ServerUser, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("users file: %w", err)
	}
	var doc struct {
		Users []ServerUser `yaml:"users"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("users file %s: %w", path, err)
	}
	if len(doc.Users) == 0 {
		return nil, fmt.Errorf("users file %s: no users (want a list under \"users:\")", path)
	}
	var errs []error
	for i := range doc.Users {
		u := &doc.Users[i]
		if u.PasswordEnv == "" {
			continue
		}
		if u.Password != "" {
			errs = append(errs, fmt.Errorf("user %d (%s): give password or password_env, not both", i+1, u.User))
			continue
		}
		v, ok := lookup(u.PasswordEnv)
		if !ok || v == "" {
			errs = append(errs, fmt.Errorf("user %d (%s): password_env %s is not set", i+1, u.User, u.PasswordEnv))
			continue
		}
		u.Password = v
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("users file %s: %w", path, err)
	}
	if err := ValidateUsers(doc.Users); err != nil {
		return nil, fmt.Errorf("users file %s: %w", path, err)
	}
	return doc.Users, nil
}

// ValidateUsers checks every user and reports all problems at once.
func ValidateUsers(users []ServerUser) error {
	var errs []error
	seen := map[string]bool{}
	for i, u := range users {
		name := u.User
		if u.NKey != "" {
			name = u.NKey
		}
		bad := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("user %d (%s): %s", i+1, name, fmt.Sprintf(format, a...)))
		}
		switch {
		case u.NKey != "" && (u.User != "" || u.Password != "" || u.PasswordEnv != ""):
			bad("give user and password, or nkey, not both")
		case u.NKey != "" && !nkeys.IsValidPublicUserKey(u.NKey):
			bad("nkey is not a user public key (U...); the seed (SU...) stays with the client")
		case u.NKey == "" && (u.User == "" || u.Password == ""):
			bad("needs user and password, or nkey")
		}
		if _, err := Permissions(u.Role, MustNames(DefaultPrefix), u.InboxPrefix); err != nil {
			bad("%v", err)
		}
		if name != "" && seen[name] {
			bad("listed twice")
		}
		seen[name] = true
	}
	return errors.Join(errs...)
}

// inProcessKeys holds, per embedded server with users, the nkey of its
// in-process user: Connect uses it for an in-process connection that
// brings no credentials of its own.
var inProcessKeys sync.Map // *server.Server -> nkeys.KeyPair

// applyUsers adds the users, the system account and the in-process user to
// opts, and returns the in-process user's key.
func applyUsers(opts *server.Options, users []ServerUser, n Names) (nkeys.KeyPair, error) {
	if err := ValidateUsers(users); err != nil {
		return nil, err
	}
	// Mark authorization as configured, as a configuration file's
	// authorization block does: without the mark, a server whose only
	// accounts are the global and the system one adds a user of its own
	// for clients without credentials (meant for servers that put users in
	// the system account only), and anyone would get in.
	if err := opts.ProcessConfigString("authorization {\n}"); err != nil {
		return nil, err
	}
	sys := server.NewAccount(SystemAccount)
	opts.Accounts = append(opts.Accounts, sys)
	opts.SystemAccount = SystemAccount
	for _, u := range users {
		perms, err := Permissions(u.Role, n, u.InboxPrefix)
		if err != nil {
			return nil, err
		}
		var acc *server.Account // nil: the global account, which holds the fleet's JetStream assets
		if u.Role == RoleSystem {
			acc = sys
		}
		if u.NKey != "" {
			opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: u.NKey, Permissions: perms, Account: acc})
		} else {
			opts.Users = append(opts.Users, &server.User{Username: u.User, Password: u.Password, Permissions: perms, Account: acc})
		}
	}
	// The roles of `agentfleet up` connect in process: they get a user of
	// their own, made at each start, which no network client can use.
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: pub,
		AllowedConnectionTypes: map[string]struct{}{jwt.ConnectionTypeInProcess: {}}})
	return kp, nil
}

// RenderUser renders a nats-server configuration entry for one user of role,
// for the list in an `authorization { users: [...] }` block (or an
// account's users) of an external server. user names the user; password
// (a bcrypt hash from `nats server passwd`, or a placeholder) or nkey (a
// public key) authenticates it.
func RenderUser(role string, n Names, inboxPrefix, user, password, nkey string) (string, error) {
	perms, err := Permissions(role, n, inboxPrefix)
	if err != nil {
		return "", err
	}
	if role == RoleSystem {
		return "", errors.New("role system: put the user in the server's system account (system_account), which needs no permissions")
	}
	entry := map[string]any{}
	if nkey != "" {
		entry["nkey"] = nkey
	} else {
		entry["user"] = user
		entry["password"] = password
	}
	if perms != nil {
		p := map[string]any{
			"publish":   map[string]any{"allow": perms.Publish.Allow},
			"subscribe": map[string]any{"allow": perms.Subscribe.Allow},
		}
		if perms.Response != nil {
			p["allow_responses"] = map[string]any{"max": perms.Response.MaxMsgs, "expires": perms.Response.Expires.String()}
		}
		entry["permissions"] = p
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# agentfleet role %q, prefix %q, inbox prefix %q\n", role, n.Prefix(), inboxOrDefault(inboxPrefix))
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(entry); err != nil {
		return "", err
	}
	return b.String(), nil
}

func inboxOrDefault(p string) string {
	if p == "" {
		return DefaultInboxPrefix
	}
	return p
}
