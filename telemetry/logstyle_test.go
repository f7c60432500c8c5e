package telemetry_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/telemetry"
)

// TestOneErrorKey: every log call of the module that logs an error logs it
// under telemetry.ErrorKey ("error"), never under another key such as
// "err", so that one query finds every error line.
func TestOneErrorKey(t *testing.T) {
	logMethods := map[string]bool{"Debug": true, "Info": true, "Warn": true, "Error": true,
		"DebugContext": true, "InfoContext": true, "WarnContext": true, "ErrorContext": true,
		"Log": true, "LogAttrs": true, "With": true}
	fset := token.NewFileSet()
	var checked int
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name != ".." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !logMethods[sel.Sel.Name] {
				return true
			}
			for _, a := range call.Args {
				var key string
				switch a := a.(type) {
				case *ast.BasicLit:
					key, _ = strconv.Unquote(a.Value)
				case *ast.CallExpr: // slog.Any("err", ...)
					if s, ok := a.Fun.(*ast.SelectorExpr); ok && len(a.Args) > 0 {
						if id, ok := s.X.(*ast.Ident); ok && id.Name == "slog" {
							if lit, ok := a.Args[0].(*ast.BasicLit); ok {
								key, _ = strconv.Unquote(lit.Value)
							}
						}
					}
				}
				if key == "err" || key == "Error" || key == "errors" {
					t.Errorf("%s: a log call's error key is %q, want %q", fset.Position(a.Pos()), key, telemetry.ErrorKey)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("only %d files checked", checked)
	}
}

// TestTypedLogAttrs: the module's log calls pass typed attributes
// (slog.String, slog.Int, slog.Any(telemetry.ErrorKey, err), ... or
// telemetry.Err), never alternating key/value pairs such as
// log.Info("msg", "lane", lane), whose keys a typo or an odd count turns
// into !BADKEY lines. A logger is recognised by its name (log, logger, slog,
// or a field named so); LogAttrs is typed by its signature.
func TestTypedLogAttrs(t *testing.T) {
	violations := typedLogViolations(t, "..")
	for _, v := range violations {
		t.Error(v)
	}
	// The check finds an untyped call (a check that cannot fail proves
	// nothing).
	dir := t.TempDir()
	bad := "package p\n\nimport \"log/slog\"\n\nfunc f(log *slog.Logger, lane string, err error) {\n" +
		"\tlog.Info(\"ok\", slog.String(\"lane\", lane), slog.Any(\"error\", err))\n" +
		"\tlog.Warn(\"bad\", \"lane\", lane)\n" +
		"\tlog.With(\"worker\", lane).Info(\"bad too\")\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := typedLogViolations(t, dir); len(got) != 2 {
		t.Errorf("untyped calls found in a file with two: %v", got)
	}
}

// typedLogViolations returns the log calls under root that pass an
// argument other than a typed attribute.
func typedLogViolations(t *testing.T, root string) []string {
	t.Helper()
	// The index of the first attribute argument of each logger method.
	first := map[string]int{"Debug": 1, "Info": 1, "Warn": 1, "Error": 1,
		"DebugContext": 2, "InfoContext": 2, "WarnContext": 2, "ErrorContext": 2,
		"Log": 3, "With": 0}
	ctors := map[string]bool{"String": true, "Int": true, "Int64": true, "Uint64": true, "Float64": true,
		"Bool": true, "Time": true, "Duration": true, "Any": true, "Group": true}
	isLogger := func(x ast.Expr) bool {
		var name string
		switch x := x.(type) {
		case *ast.Ident:
			name = x.Name
		case *ast.SelectorExpr:
			name = x.Sel.Name
		case *ast.CallExpr: // log.With(...).Info(...)
			if s, ok := x.Fun.(*ast.SelectorExpr); ok && s.Sel.Name == "With" {
				return true
			}
		}
		return name == "slog" || name == "log" || name == "logger" || name == "Logger" || name == "Log"
	}
	typed := func(a ast.Expr) bool {
		call, ok := a.(*ast.CallExpr)
		if !ok {
			return false
		}
		switch f := call.Fun.(type) {
		case *ast.SelectorExpr:
			pkg, ok := f.X.(*ast.Ident)
			return ok && ((pkg.Name == "slog" && ctors[f.Sel.Name]) || (pkg.Name == "telemetry" && f.Sel.Name == "Err"))
		case *ast.Ident:
			return f.Name == "Err" // telemetry.Err inside package telemetry
		}
		return false
	}
	fset := token.NewFileSet()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name != ".." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !isLogger(sel.X) {
				return true
			}
			i, ok := first[sel.Sel.Name]
			if !ok || call.Ellipsis.IsValid() || len(call.Args) <= i {
				return true
			}
			for _, a := range call.Args[i:] {
				if !typed(a) {
					out = append(out, fmt.Sprintf("%s: %s passes %s, not a typed attribute (slog.String, slog.Int, slog.Any(%q, err), ...)",
						fset.Position(a.Pos()), sel.Sel.Name, types.ExprString(a), telemetry.ErrorKey))
					break
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
