package nodecheck

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// node builds a /proc and /sys tree under a temp dir from recorded files.
func node(t *testing.T, procDRBD string, modules ...string) string {
	t.Helper()
	root := t.TempDir()
	if procDRBD != "" {
		b, err := os.ReadFile(filepath.Join("testdata", procDRBD))
		if err != nil {
			t.Fatal(err)
		}
		must(t, os.MkdirAll(filepath.Join(root, "proc"), 0o755))
		must(t, os.WriteFile(filepath.Join(root, "proc", "drbd"), b, 0o644))
	}
	for _, m := range modules {
		must(t, os.MkdirAll(filepath.Join(root, "sys", "module", m), 0o755))
	}
	return root
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func recorded(name string) func(context.Context) (string, error) {
	return func(context.Context) (string, error) {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		return string(b), err
	}
}

func allTools(string) (string, error) { return "/usr/sbin/tool", nil }

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name      string
		root      func(t *testing.T) string
		opts      Options
		wantFail  []string // substrings of the failed findings, in order
		wantCount int
	}{
		{
			name: "a DRBD 9.2.18 node with LVM thin (the recorded machines)",
			root: func(t *testing.T) string {
				return node(t, "proc-drbd-9.2.18.txt", "drbd", "drbd_transport_tcp", "dm_mod", "dm_thin_pool", "dm_snapshot")
			},
			opts:      Options{Thin: true, DRBDAdmVersion: recorded("drbdadm-version-9.22.txt")},
			wantCount: 12,
		},
		{
			name:     "no DRBD module at all",
			root:     func(t *testing.T) string { return node(t, "") },
			opts:     Options{DRBDAdmVersion: recorded("drbdadm-version-9.22.txt")},
			wantFail: []string{"drbd kernel module: not loaded", "drbd_transport_tcp (DRBD's TCP transport): not loaded"},
		},
		{
			name:     "the in-tree DRBD 8.4",
			root:     func(t *testing.T) string { return node(t, "proc-drbd-8.4.txt", "drbd") },
			opts:     Options{DRBDAdmVersion: recorded("drbdadm-version-9.22.txt")},
			wantFail: []string{"version 8.4.11 is loaded, meshvol needs 9.2", "drbd_transport_tcp"},
		},
		{
			name: "thin pool without dm_thin_pool",
			root: func(t *testing.T) string {
				return node(t, "proc-drbd-9.2.18.txt", "drbd", "drbd_transport_tcp", "dm_mod")
			},
			opts:     Options{Thin: true, DRBDAdmVersion: recorded("drbdadm-version-9.22.txt")},
			wantFail: []string{"dm_thin_pool", "dm_snapshot"},
		},
		{
			name: "old drbd-utils",
			root: func(t *testing.T) string { return node(t, "proc-drbd-9.2.18.txt", "drbd_transport_tcp") },
			opts: Options{DRBDAdmVersion: func(context.Context) (string, error) {
				return "DRBDADM_API_VERSION=2\nDRBDADM_VERSION_CODE=0x091500\nDRBDADM_VERSION=9.21.4\n", nil
			}},
			wantFail: []string{"drbdadm 9.21.4, meshvol needs 9.22"},
		},
		{
			name: "drbdadm missing",
			root: func(t *testing.T) string { return node(t, "proc-drbd-9.2.18.txt", "drbd_transport_tcp") },
			opts: Options{DRBDAdmVersion: func(context.Context) (string, error) {
				return "", errors.New(`exec: "drbdadm": executable file not found in $PATH`)
			}},
			wantFail: []string{"`drbdadm --version` failed"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opts
			o.Root = tc.root(t)
			if o.LookPath == nil {
				o.LookPath = allTools
			}
			fs := Check(context.Background(), o)
			if tc.wantCount != 0 && len(fs) != tc.wantCount {
				t.Errorf("%d findings, want %d: %v", len(fs), tc.wantCount, fs)
			}
			missing := Missing(fs)
			if len(missing) != len(tc.wantFail) {
				t.Fatalf("failed findings:\n  %s\nwant %d containing %q", strings.Join(missing, "\n  "), len(tc.wantFail), tc.wantFail)
			}
			for i, want := range tc.wantFail {
				if !strings.Contains(missing[i], want) {
					t.Errorf("finding %d = %q, want it to contain %q", i, missing[i], want)
				}
			}
		})
	}
}

func TestMissingTool(t *testing.T) {
	root := node(t, "proc-drbd-9.2.18.txt", "drbd_transport_tcp")
	fs := Check(context.Background(), Options{Root: root, DRBDAdmVersion: recorded("drbdadm-version-9.22.txt"),
		LookPath: func(p string) (string, error) {
			if p == "mkfs.xfs" {
				return "", errors.New("not found")
			}
			return "/sbin/" + p, nil
		}})
	m := Missing(fs)
	if len(m) != 1 || !strings.HasPrefix(m[0], "mkfs.xfs: not found in PATH") {
		t.Fatalf("missing = %q", m)
	}
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string][3]int{"9.2.18": {9, 2, 18}, "9.22.0": {9, 22, 0}, "9.2": {9, 2, 0}, "9.3.0rc1": {9, 3, 0}} {
		got, err := parseVersion(in)
		if err != nil || got != want {
			t.Errorf("parseVersion(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := parseVersion("nine"); err == nil {
		t.Error("parseVersion(nine) succeeded")
	}
}
