package lvm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The LVM tests cannot run lvm2 here (no device-mapper in this kernel). They run
// the provider against a Runner that replays real lvm2 runs recorded on a
// Debian bookworm VM (testdata/README.md) and checks every argv it receives.
//
// Provenance is checked, not assumed: each replay step names a capture file,
// and the argv the provider must issue is compared with the capture's recorded
// command line. The differences allowed are few and explicit:
//   - "--config <cfg>" after the command name: the captures from 06j on ran
//     with the same two settings in lvm.conf instead (testdata/README.md).
//     A capture recorded from the provider itself (vm-36, by the VM tier)
//     has it on its command line; there it must be exactly cfg.
//   - rename: the recorded run's LV names mapped to the names our naming
//     derives, applied identically to the recorded command and its output.
//   - added: arguments ours has and the recorded command had not (our tags),
//     each with a reason why they do not change lvm2's output.
//   - compound lines ("exec 3<...; lvremove ...; echo exit: $?"): the step
//     names the inner command, which must appear in the recorded line, and the
//     inner exit code, which must appear as "exit: N" in the recorded stdout.

// cfg is the --config every lvm2 command must carry, written out here rather
// than taken from the provider so a change there fails these tests.
const cfg = "activation { udev_sync = 0 udev_rules = 0 }"

var lvsArgv = []string{"lvs", "--config", cfg, "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
	"lv_name,vg_name,lv_size,lv_attr,lv_tags,lv_path,lv_uuid,pool_lv,data_percent,metadata_percent"}

var vgsArgv = []string{"vgs", "--config", cfg, "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
	"vg_name,vg_size,vg_free,vg_extent_size,vg_uuid,vg_tags"}

// capture is one recorded command: its command line, exit code and output.
type capture struct {
	file   string
	cmd    string
	exit   int
	stdout string
	stderr string
}

var (
	replayedMu sync.Mutex
	replayed   = map[string]bool{}
)

func markReplayed(file string) {
	replayedMu.Lock()
	replayed[file] = true
	replayedMu.Unlock()
}

func TestMain(m *testing.M) {
	code := m.Run()
	files := make([]string, 0, len(replayed))
	for f := range replayed {
		files = append(files, f)
	}
	sort.Strings(files)
	fmt.Printf("lvm: %d distinct recorded captures replayed: %s\n", len(files), strings.Join(files, " "))
	os.Exit(code)
}

func loadCapture(t testing.TB, file string) capture {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatalf("capture: %v", err)
	}
	c, err := parseCapture(file, string(data))
	if err != nil {
		t.Fatalf("capture %s: %v", file, err)
	}
	return c
}

func parseCapture(file, s string) (capture, error) {
	c := capture{file: file}
	line1, rest, ok := strings.Cut(s, "\n")
	if !ok || !strings.HasPrefix(line1, "$ ") {
		return c, fmt.Errorf("line 1 is not \"$ <command>\"")
	}
	c.cmd = strings.TrimPrefix(line1, "$ ")
	line2, rest, ok := strings.Cut(rest, "\n")
	if !ok || !strings.HasPrefix(line2, "# exit code: ") {
		return c, fmt.Errorf("line 2 is not \"# exit code: N\"")
	}
	n, err := strconv.Atoi(strings.TrimPrefix(line2, "# exit code: "))
	if err != nil {
		return c, fmt.Errorf("exit code: %v", err)
	}
	c.exit = n
	rest, ok = strings.CutPrefix(rest, "# --- stdout ---\n")
	if !ok {
		return c, fmt.Errorf("no stdout marker")
	}
	out, errOut, ok := strings.Cut(rest, "# --- stderr ---\n")
	if !ok {
		// An empty stderr section may end the file without a newline.
		out, ok = strings.CutSuffix(rest, "# --- stderr ---")
		if !ok {
			return c, fmt.Errorf("no stderr marker")
		}
	}
	c.stdout, c.stderr = out, errOut
	return c, nil
}

// shellWords splits a simple recorded command line: words, '...' and "..."
// quoting. It is enough for the single commands the provider replays.
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\'' || c == '"':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("unterminated quote in %q", s)
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == ';' || c == '|' || c == '&' || c == '<' || c == '>' || c == '$' || c == '`':
			return nil, fmt.Errorf("%q is not a single command (found %q); name the inner command", s, c)
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// step is one expected command and the recorded run that answers it.
type step struct {
	argv    []string          // exactly what the provider must run
	capture string            // testdata file replayed as the answer
	rename  map[string]string // recorded name -> our name, in command and output
	added   []string          // args in argv that the recorded command lacked
	why     string            // why the differences do not change the output
	// For compound recorded lines:
	inner     string // the lvm2 command inside the recorded line
	innerExit int    // its exit code, echoed as "exit: N" in the recorded stdout
	cut       string // stdout is cut at the first line starting with this
	// hang makes the step block until the context ends (a hung lvm2).
	hang bool
	// synthetic marks a hand-written answer (testdata/synthetic/README.md),
	// used only where no recorded run exists; it says what it was derived
	// from. Its output is synthStdoutFile (under testdata/synthetic), synthStderr
	// and synthExit. It is not counted as a replayed capture.
	synthetic       string
	synthStdoutFile string
	synthStderr     string
	synthExit       int
}

// replay is the fake Runner.
type replay struct {
	t     testing.TB
	steps []step
	next  int
}

func newReplay(t testing.TB, steps ...step) *replay {
	t.Helper()
	for i, st := range steps {
		if st.hang || st.synthetic != "" {
			continue
		}
		if err := checkProvenance(t, st); err != nil {
			t.Fatalf("step %d (%s): %v", i, st.capture, err)
		}
	}
	r := &replay{t: t, steps: steps}
	t.Cleanup(func() {
		if r.next != len(r.steps) {
			t.Errorf("provider ran %d of %d expected commands; next expected: %q", r.next, len(r.steps), r.steps[r.next].argv)
		}
	})
	return r
}

func renamed(s string, m map[string]string) string {
	// Longest names first, so "rvr-odd" is not caught by a rule for "rvr-o".
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
	for _, k := range keys {
		s = strings.ReplaceAll(s, k, m[k])
	}
	return s
}

// checkProvenance verifies that st.argv is the recorded command, up to the
// documented differences.
func checkProvenance(t testing.TB, st step) error {
	c := loadCapture(t, st.capture)
	recorded := c.cmd
	if st.inner != "" {
		if !strings.Contains(recorded, st.inner) {
			return fmt.Errorf("inner command %q is not in the recorded line %q", st.inner, recorded)
		}
		// The inner exit code is either echoed ("exit: N") or, for a chain
		// whose every command succeeded, the line's own 0.
		echoed := strings.Contains(c.stdout, fmt.Sprintf("exit: %d\n", st.innerExit))
		if !echoed && (st.innerExit != 0 || c.exit != 0 || strings.Contains(c.stdout, "exit: ")) {
			return fmt.Errorf("recorded output does not show the inner exit code %d", st.innerExit)
		}
		recorded = st.inner
	}
	want, err := shellWords(renamed(recorded, st.rename))
	if err != nil {
		return err
	}
	got := slices.Clone(st.argv)
	if len(got) < 3 || got[1] != "--config" || got[2] != cfg {
		return fmt.Errorf("argv %q does not carry --config %q", got, cfg)
	}
	got = slices.Delete(got, 1, 3)
	if len(want) >= 2 && want[1] == "--config" {
		if len(want) < 3 || want[2] != cfg {
			return fmt.Errorf("recorded command %q ran with a --config other than %q", want, cfg)
		}
		want = slices.Delete(want, 1, 3)
	}
	for _, a := range st.added {
		i := slices.Index(got, a)
		if i < 0 {
			return fmt.Errorf("added argument %q is not in argv %q", a, st.argv)
		}
		got = slices.Delete(got, i, i+1)
	}
	if len(st.added) > 0 && st.why == "" {
		return fmt.Errorf("added arguments need a reason")
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("argv %q (without --config and added args: %q) is not the recorded command %q", st.argv, got, want)
	}
	return nil
}

func (r *replay) Run(ctx context.Context, name string, args ...string) ([]byte, []byte, error) {
	r.t.Helper()
	got := append([]string{name}, args...)
	if r.next >= len(r.steps) {
		r.t.Fatalf("unexpected command %q: all %d expected commands already ran", got, len(r.steps))
	}
	st := r.steps[r.next]
	r.next++
	if !slices.Equal(got, st.argv) {
		r.t.Fatalf("command %d:\n got  %q\n want %q", r.next, got, st.argv)
	}
	if _, ok := ctx.Deadline(); !ok {
		r.t.Fatalf("command %q was run without a deadline", got)
	}
	if st.hang {
		<-ctx.Done()
		return nil, nil, &CommandError{Argv: got, ExitCode: -1, Err: ctx.Err()}
	}
	if st.synthetic != "" {
		var stdout []byte
		if st.synthStdoutFile != "" {
			var err error
			if stdout, err = os.ReadFile(filepath.Join("testdata", "synthetic", st.synthStdoutFile)); err != nil {
				r.t.Fatalf("synthetic: %v", err)
			}
		}
		if st.synthExit != 0 {
			return stdout, []byte(st.synthStderr), &CommandError{Argv: got, ExitCode: st.synthExit, Stderr: st.synthStderr}
		}
		return stdout, []byte(st.synthStderr), nil
	}
	c := loadCapture(r.t, st.capture)
	markReplayed(st.capture)
	stdout, stderr, exit := renamed(c.stdout, st.rename), renamed(c.stderr, st.rename), c.exit
	if st.inner != "" {
		exit = st.innerExit
	}
	if st.cut != "" {
		var kept []string
		for _, l := range strings.SplitAfter(stdout, "\n") {
			if strings.HasPrefix(l, st.cut) {
				break
			}
			kept = append(kept, l)
		}
		stdout = strings.Join(kept, "")
	}
	if exit != 0 {
		return []byte(stdout), []byte(stderr), &CommandError{Argv: got, ExitCode: exit, Stderr: stderr}
	}
	return []byte(stdout), []byte(stderr), nil
}

func TestShellWords(t *testing.T) {
	got, err := shellWords(`lvcreate --config 'activation { udev_sync = 0 }' -y -n "a b" vg0`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"lvcreate", "--config", "activation { udev_sync = 0 }", "-y", "-n", "a b", "vg0"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q want %q", got, want)
	}
	if _, err := shellWords(`lvs; echo x`); err == nil {
		t.Fatal("compound line accepted")
	}
}

// TestCapturesParse loads every capture: the harness must understand all of
// them, and each must be what its file name says (a command and an exit code).
func TestCapturesParse(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no captures: %v", err)
	}
	for _, f := range files {
		c := loadCapture(t, filepath.Base(f))
		if c.cmd == "" {
			t.Errorf("%s: empty command", f)
		}
	}
}
