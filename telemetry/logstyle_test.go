package telemetry_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
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
