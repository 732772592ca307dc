package drbd

import (
	"context"
	"strings"
	"testing"

	"github.com/meshvol/meshvol/pkg/drbd/internal/captures"
)

// Seeds: every recorded line and JSON document.
func addCaptureSeeds(f *testing.F, substr string, perLine bool) {
	for _, name := range captures.Files(f, substr) {
		b := captures.Read(f, name)
		if !perLine {
			f.Add(b)
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			f.Add([]byte(l))
		}
	}
}

// FuzzParseEvent: never panics; whatever parses applies to a state without
// panicking, and the observer survives any stream.
func FuzzParseEvent(f *testing.F) {
	addCaptureSeeds(f, "events2", true)
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, err := ParseEvent(string(line))
		if err != nil {
			return
		}
		if !ev.EndOfDump && ev.Name() == "" && ev.Object != "" {
			t.Fatalf("parsed %q without a name", line)
		}
		m := map[string]*ResourceState{}
		_ = applyTo(m, &ev)
		for _, s := range m {
			_ = s.Clone().Diff(s)
		}
	})
}

func FuzzObserverStream(f *testing.F) {
	addCaptureSeeds(f, "events2", false)
	f.Fuzz(func(t *testing.T, stream []byte) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		o := NewObserver(scriptedSource(cancel, string(stream)), ObserverOptions{Clock: &fakeClock{}})
		go func() {
			for range o.Changes() {
			}
		}()
		_ = o.Run(ctx)
	})
}

func FuzzParseStatusJSON(f *testing.F) {
	addCaptureSeeds(f, "status-json", false)
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ParseStatusJSON(data)
		if err != nil {
			return
		}
		for _, r := range st {
			_ = StateFromStatus(r).Clone()
		}
	})
}

func FuzzParseShowJSON(f *testing.F) {
	addCaptureSeeds(f, "show-json", false)
	f.Fuzz(func(t *testing.T, data []byte) {
		sh, err := ParseShowJSON(data)
		if err != nil {
			return
		}
		for _, r := range sh {
			for _, c := range r.Connections {
				_ = c.AllPaths()
				_ = c.Name()
			}
		}
	})
}
