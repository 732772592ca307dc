package drbd

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
)

// Every .res file rendered by any test in this package is parsed by the real
// drbdadm (Debian drbd-utils 9.22). Two facts about drbdadm make that work
// on a machine that is none of the hosts in the file (found by running it):
//
//   - `drbdadm -c FILE dump` without a resource name parses the file and
//     prints resources that do not name this host as "ignored"; `dump NAME`
//     then fails with "'NAME' not defined in your config (for this host)".
//   - drbdadm reads the environment variable __DRBD_NODE__ and pretends to be
//     that host ("PRETENDING that I am >>node1<<"). With it set to the file's
//     own node, `dump NAME` treats the resource as "not ignored, not stacked",
//     i.e. checks it exactly as the agent's node would.
//
// drbdadm also runs `modinfo` to learn the kernel module version and prints
// "sh: 1: modinfo: not found" where there is none; that line and the
// PRETENDING banner are the only stderr we accept.

type drbdadmChecker struct {
	mu      sync.Mutex
	done    map[[32]byte]bool         // content+self hash → checked
	pending map[[32]byte]renderedFile // seen by renderHook, checked in TestMain
	renders int                       // Render calls seen by the hook
	checked int
	failed  []string
}

type renderedFile struct {
	self, name string
	nonVoting  bool
	text       []byte
}

var checker = &drbdadmChecker{done: map[[32]byte]bool{}, pending: map[[32]byte]renderedFile{}}

func fileKey(self string, text []byte) [32]byte {
	return sha256.Sum256(append([]byte(self+"\x00"), text...))
}

// record is the renderHook: it remembers every rendered file.
func (c *drbdadmChecker) record(r *Resource, f Features, out []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.renders++
	key := fileKey(r.Self.Name, out)
	if _, seen := c.pending[key]; !seen {
		c.pending[key] = renderedFile{self: r.Self.Name, name: r.Name, nonVoting: f.NonVoting, text: bytes.Clone(out)}
	}
}

// drbdadmPath finds drbdadm or explains how to get it. Never a skip: the
// renderer is not tested unless the real parser has read its output.
func drbdadmPath() (string, error) {
	for _, p := range []string{"drbdadm", "/usr/sbin/drbdadm", "/sbin/drbdadm"} {
		if path, err := exec.LookPath(p); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("drbdadm not found: run apt-get install drbd-utils (Debian drbd-utils 9.22 is the reference parser for rendered .res files)")
}

// checkText runs drbdadm on text as node self and returns an error
// describing any rejection. It does the work once per distinct file.
func (c *drbdadmChecker) checkText(self, name string, nonVoting bool, text []byte) error {
	key := fileKey(self, text)
	c.mu.Lock()
	if c.done[key] {
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()

	err := runDrbdadmCheck(self, name, nonVoting, text)

	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done[key] {
		c.done[key] = true
		c.checked++
		if err != nil {
			c.failed = append(c.failed, fmt.Sprintf("%s as %s: %v", name, self, err))
		}
	}
	return err
}

func runDrbdadmCheck(self, name string, nonVoting bool, text []byte) error {
	if !nonVoting {
		return drbdadmDump(self, name, text)
	}
	// drbd-utils 9.22 has no non-voting option (docs/drbd-quorum.md). A file
	// rendered for a DRBD that has it must be rejected by 9.22 for that
	// keyword and nothing else: the same file without the non-voting line
	// must pass.
	err := drbdadmDump(self, name, text)
	if err == nil {
		return fmt.Errorf("drbdadm 9.22 accepted non-voting; if this drbd-utils supports it, update the check")
	}
	if !strings.Contains(err.Error(), "non-voting") {
		return fmt.Errorf("rejected, but not for non-voting: %v", err)
	}
	var stripped []byte
	for _, l := range bytes.SplitAfter(text, []byte("\n")) {
		if !bytes.Contains(l, []byte("non-voting")) {
			stripped = append(stripped, l...)
		}
	}
	if err := drbdadmDump(self, name, stripped); err != nil {
		return fmt.Errorf("without the non-voting line: %v", err)
	}
	return nil
}

func drbdadmDump(self, name string, text []byte) error {
	bin, err := drbdadmPath()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "meshvol-drbdadm-check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, name+".res")
	if err := os.WriteFile(file, text, 0o600); err != nil {
		return err
	}
	cmd := exec.Command(bin, "-c", file, "dump", name)
	cmd.Env = append(os.Environ(), "__DRBD_NODE__="+self)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	unexpected := unexpectedStderr(stderr.String(), self)
	if runErr != nil || unexpected != "" {
		return fmt.Errorf("`__DRBD_NODE__=%s drbdadm -c %s dump %s`: %v: %s\n--- file ---\n%s",
			self, file, name, runErr, strings.TrimSpace(unexpected), text)
	}
	// drbdadm quotes names with characters such as '+' in its dump.
	q := func(s string) []string { return []string{s, fmt.Sprintf("%q", s)} }
	treated := false
	for _, n := range q(name) {
		for _, h := range q(self) {
			treated = treated || strings.Contains(stdout.String(), fmt.Sprintf("# resource %s on %s: not ignored", n, h))
		}
	}
	if !treated {
		return fmt.Errorf("drbdadm did not treat %s as this node's resource:\n%s", name, stdout.String())
	}
	return nil
}

func unexpectedStderr(stderr, self string) string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		t := strings.TrimSpace(l)
		switch {
		case t == "",
			t == "found __DRBD_NODE__ in environment",
			t == "PRETENDING that I am >>"+self+"<<",
			strings.HasSuffix(t, "modinfo: not found"):
			continue
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// renderChecked renders r and fails t unless drbdadm accepts the result.
func renderChecked(t testing.TB, r *Resource, f Features) []byte {
	t.Helper()
	out, err := Render(r, f)
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	if err := checker.checkText(r.Self.Name, r.Name, f.NonVoting, out); err != nil {
		t.Fatalf("drbdadm rejected the rendered file: %v", err)
	}
	return out
}

// finish checks every file rendered anywhere that no test checked itself,
// prints the count and reports failures. Called from TestMain.
func (c *drbdadmChecker) finish() (summary string, ok bool) {
	c.mu.Lock()
	pending := c.pending
	c.pending = map[[32]byte]renderedFile{}
	renders := c.renders
	c.mu.Unlock()
	for _, p := range pending {
		_ = c.checkText(p.self, p.name, p.nonVoting, p.text)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	sort.Strings(c.failed)
	if len(c.failed) > 0 {
		return fmt.Sprintf("drbdadm rejected %d of %d rendered files:\n%s",
			len(c.failed), c.checked, strings.Join(c.failed, "\n")), false
	}
	return fmt.Sprintf("drbdadm (drbd-utils) parsed %d distinct rendered .res files (%d Render calls seen by the hook), all accepted", c.checked, renders), true
}
