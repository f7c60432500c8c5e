package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Load builds the configuration in the order default < file < environment:
// it starts from Default, decodes the YAML file at path over it (when path is
// not empty; a missing file is an error naming it), applies the environment
// variables listed by Keys (AGENTFLEET_*, and NATS_URL for nats.url when
// AGENTFLEET_NATS_URL is unset; an empty variable counts as unset), sets Worker.ID to "<hostname>-<pid>" if it is still
// empty, and runs Validate.
//
// env looks a variable up, like os.LookupEnv; nil means no environment.
// Unknown YAML keys are refused. All problems are reported at once: the error
// joins one *FieldError per refused value, each naming the key, the value
// and, when known, where it came from (file and line, or variable).
//
// Flags come last: a command passes them to LoadWith, which applies them
// before the one validation, so a flag overrides an invalid environment or
// file value of the same key instead of being refused because of it.
func Load(path string, env func(string) (string, bool)) (Config, error) {
	return LoadWith(path, env, nil)
}

// Override is a value given on the command line for a key.
type Override struct {
	// Path is the key ("http.addr"), Value its text as in the environment,
	// Source where it came from, for errors ("flag --http").
	Path, Value, Source string
}

// LoadWith is Load with overrides (command-line flags) applied last, over
// the environment, before validation.
func LoadWith(path string, env func(string) (string, bool), overrides []Override) (Config, error) {
	c, _, err := LoadSourced(path, env, overrides)
	return c, err
}

// Sources maps a key path ("http.addr") to where LoadSourced took its value
// from: a file and line ("fleet.yaml:7"), an environment variable, or an
// override's Source ("flag --http"). Keys left at their default are absent.
type Sources map[string]string

// Of returns where the value of the key at path came from, "" for a default.
// A nil Sources knows nothing.
func (s Sources) Of(path string) string { return s[path] }

// LoadSourced is LoadWith that also says where each value came from, for
// checks that depend on the role (CheckUp, CheckHTTP) and for printing.
func LoadSourced(path string, env func(string) (string, bool), overrides []Override) (Config, Sources, error) {
	c := Default()
	origin := map[string]string{} // key path -> where its value came from
	var errs []error
	if path != "" {
		fileErrs, err := c.decodeFile(path, origin)
		if err != nil {
			return Config{}, nil, err
		}
		errs = append(errs, fileErrs...)
	}
	if env != nil {
		errs = append(errs, c.applyEnv(env, origin)...)
	}
	for _, o := range overrides {
		if err := c.set(o.Path, o.Value, o.Source); err != nil {
			errs = append(errs, err)
			continue
		}
		origin[o.Path] = o.Source
		// The flag replaces the value: an earlier refusal of the same key
		// (a bad environment value) no longer stands.
		errs = dropField(errs, o.Path)
	}
	if c.Worker.ID == "" {
		c.Worker.ID = DefaultWorkerID()
	}
	if err := c.Validate(); err != nil {
		for _, e := range unwrapJoined(err) {
			var fe *FieldError
			if errors.As(e, &fe) && fe.Source == "" {
				fe.Source = origin[fe.Field]
			}
			errs = append(errs, e)
		}
	}
	if len(errs) > 0 {
		return Config{}, nil, errors.Join(errs...)
	}
	return c, origin, nil
}

// dropField removes the *FieldError of key path from errs.
func dropField(errs []error, path string) []error {
	out := errs[:0]
	for _, e := range errs {
		var fe *FieldError
		if errors.As(e, &fe) && fe.Field == path {
			continue
		}
		out = append(out, e)
	}
	return out
}

// DefaultWorkerID returns "<hostname>-<pid>", the worker id Load uses when
// none is configured ("worker-<pid>" if the host name is unknown).
func DefaultWorkerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	host = strings.Map(func(r rune) rune {
		if r <= ' ' || r == 0x7f {
			return '_'
		}
		return r
	}, host)
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// decodeFile decodes the YAML file at path over c. A file that cannot be read
// or parsed returns err and leaves c unchanged. Values of the wrong type and
// unknown keys come back as fileErrs, one *FieldError each, while the other
// values are still applied, so that every problem is reported at once.
func (c *Config) decodeFile(path string, origin map[string]string) (fileErrs []error, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	idx := indexYAML(data)
	next := c.clone()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err = dec.Decode(&next)
	var te *yaml.TypeError
	switch {
	case errors.Is(err, io.EOF): // empty file
		return nil, nil
	case errors.As(err, &te):
		fileErrs = idx.fieldErrors(path, te)
	case err != nil:
		return nil, fmt.Errorf("config: %s: %w", path, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("config: %s: holds more than one YAML document", path)
	}
	*c = next
	for p, line := range idx.lines {
		origin[p] = fmt.Sprintf("%s:%d", path, line)
	}
	return fileErrs, nil
}

// yamlIndex maps the lines of a YAML document to the key paths on them, to
// name the key in the decoder's line-numbered errors.
type yamlIndex struct {
	keys   map[int][]string    // line -> paths of the keys written on it
	values map[int][]yamlValue // line -> values starting on it
	lines  map[string]int      // path -> line of its key
}

type yamlValue struct {
	path   string
	value  string
	kind   yaml.Kind
	scalar bool
}

func indexYAML(data []byte) *yamlIndex {
	idx := &yamlIndex{keys: map[int][]string{}, values: map[int][]yamlValue{}, lines: map[string]int{}}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return idx
	}
	idx.walk(&root, "")
	return idx
}

func (idx *yamlIndex) walk(n *yaml.Node, path string) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			idx.walk(c, path)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			idx.keys[k.Line] = append(idx.keys[k.Line], p)
			if _, seen := idx.lines[p]; !seen {
				idx.lines[p] = k.Line
			}
			idx.values[v.Line] = append(idx.values[v.Line], yamlValue{path: p, value: v.Value, kind: v.Kind, scalar: v.Kind == yaml.ScalarNode})
			idx.walk(v, p)
		}
	}
}

var (
	lineRE     = regexp.MustCompile(`^line (\d+): (.*)$`)
	notFoundRE = regexp.MustCompile(`^field (\S+) not found in type`)
	alreadyRE  = regexp.MustCompile(`^(?:field (\S+) already set in type|mapping key "(.*)" already defined at line \d+)`)
	cannotRE   = regexp.MustCompile("^cannot unmarshal !!(\\w+)(?: `(.*)`)? into (.+)$")
)

// fieldErrors turns the decoder's type errors into FieldErrors naming the key.
func (idx *yamlIndex) fieldErrors(file string, te *yaml.TypeError) []error {
	var errs []error
	for _, msg := range te.Errors {
		m := lineRE.FindStringSubmatch(msg)
		if m == nil {
			errs = append(errs, &FieldError{Reason: msg, Source: file})
			continue
		}
		line, _ := strconv.Atoi(m[1])
		body := m[2]
		src := fmt.Sprintf("%s:%d", file, line)
		if k := notFoundRE.FindStringSubmatch(body); k != nil {
			errs = append(errs, &FieldError{Field: idx.keyAt(line, k[1]), Value: k[1], Reason: fmt.Sprintf("unknown key %q", k[1]), Source: src})
			continue
		}
		if k := alreadyRE.FindStringSubmatch(body); k != nil {
			name := k[1] + k[2]
			errs = append(errs, &FieldError{Field: idx.keyAt(line, name), Value: name, Reason: fmt.Sprintf("key %q is given twice", name), Source: src})
			continue
		}
		reason := body
		var v yamlValue
		if k := cannotRE.FindStringSubmatch(body); k != nil {
			v = idx.valueAt(line, k[2], tagKind(k[1]))
			if v.scalar {
				reason = fmt.Sprintf("%q is not %s", v.value, describeType(k[3]))
			} else {
				reason = fmt.Sprintf("expected %s, got a %s", describeType(k[3]), kindName(tagKind(k[1])))
			}
		} else {
			// Our own messages (Duration) quote the value first.
			hint, _ := strconv.QuotedPrefix(body)
			hint, _ = strconv.Unquote(hint)
			v = idx.valueAt(line, hint, 0)
		}
		errs = append(errs, &FieldError{Field: v.path, Value: v.value, Reason: reason, Source: src})
	}
	return errs
}

// keyAt returns the path of the key name written on line.
func (idx *yamlIndex) keyAt(line int, name string) string {
	for _, p := range idx.keys[line] {
		if p == name || strings.HasSuffix(p, "."+name) {
			return p
		}
	}
	return name
}

// valueAt returns the value starting on line that a decoder message is
// about: the scalar equal to hint (which the decoder may have cut to 7
// characters and "..."), else the deepest value of the given kind, else the
// deepest scalar.
func (idx *yamlIndex) valueAt(line int, hint string, kind yaml.Kind) yamlValue {
	vs := idx.values[line]
	if hint != "" {
		cut, truncated := strings.CutSuffix(hint, "...")
		for _, v := range vs {
			if v.scalar && (v.value == hint || truncated && strings.HasPrefix(v.value, cut)) {
				return v
			}
		}
	}
	for i := len(vs) - 1; i >= 0; i-- {
		if kind != 0 && vs[i].kind == kind {
			return vs[i]
		}
	}
	for i := len(vs) - 1; i >= 0; i-- {
		if vs[i].scalar {
			return vs[i]
		}
	}
	if len(vs) > 0 {
		return vs[len(vs)-1]
	}
	return yamlValue{}
}

// tagKind returns the node kind of a short YAML tag ("seq", "map", "str").
func tagKind(tag string) yaml.Kind {
	switch tag {
	case "seq":
		return yaml.SequenceNode
	case "map":
		return yaml.MappingNode
	}
	return yaml.ScalarNode
}

// describeType names a Go type of the decoder's messages for users.
func describeType(t string) string {
	switch {
	case t == "int" || t == "int64":
		return "an integer"
	case t == "bool":
		return "a boolean (true or false)"
	case t == "string" || strings.HasSuffix(t, ".ResetMode") || strings.HasSuffix(t, ".Platform"):
		return "a string"
	case strings.HasPrefix(t, "map[") || strings.HasPrefix(t, "config.") || strings.HasPrefix(t, "*config."):
		return "a mapping"
	}
	return "a " + t
}

// unwrapJoined returns the errors joined in err, or err alone.
func unwrapJoined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
