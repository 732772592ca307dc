package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/meshvol/meshvol/pkg/version"
)

func TestVersionText(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	if !strings.HasPrefix(out.String(), "meshvol "+version.Version+" (commit ") {
		t.Fatalf("unexpected output %q", out.String())
	}
}

func TestVersionJSON(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"version", "-o", "json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	var info version.Info
	if err := json.Unmarshal(out.Bytes(), &info); err != nil {
		t.Fatalf("output is not JSON: %v: %q", err, out.String())
	}
	if info.Version != version.Version || info.GoVersion == "" || info.Platform == "" {
		t.Fatalf("incomplete info %+v", info)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{nil, {"bogus"}, {"version", "-o", "yaml"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("run(%q) = %d, want 2", args, code)
		}
		if errb.Len() == 0 {
			t.Errorf("run(%q) printed no explanation", args)
		}
	}
}
