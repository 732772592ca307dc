package drbd

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Seeds: every recorded line and JSON document.
func addCaptureSeeds(f *testing.F, pattern string, perLine bool) {
	_ = filepath.WalkDir(filepath.Join("testdata", "captures"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.Contains(filepath.Base(p), pattern) {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !perLine {
			f.Add(b)
			return nil
		}
		for _, l := range strings.Split(string(b), "\n") {
			f.Add([]byte(l))
		}
		return nil
	})
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
		n := 0
		o := NewObserver(func(ctx context.Context) (io.ReadCloser, error) {
			n++
			if n > 1 {
				cancel()
				return nil, ctx.Err()
			}
			return io.NopCloser(strings.NewReader(string(stream))), nil
		}, ObserverOptions{Clock: &fakeClock{}})
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
