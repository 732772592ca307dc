package memlimit

import (
	"os"
	"path/filepath"
	"testing"
)

// writeFile writes content at root/rel, making its directories.
func writeFile(t *testing.T, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLimit(t *testing.T) {
	const mi = 1 << 20
	for _, tc := range []struct {
		name       string
		procCgroup string
		files      map[string]string
		want       int64
	}{
		{
			// A pod's container under cgroup v1, as this machine's kernel mounts
			// it: the memory hierarchy names the process's cgroup.
			name:       "v1, own cgroup limited",
			procCgroup: "9:name=systemd:/\n4:memory:/bench/controller\n1:cpu:/\n0::/\n",
			files: map[string]string{
				"memory/memory.limit_in_bytes":                  "9223372036854771712\n",
				"memory/bench/memory.limit_in_bytes":            "9223372036854771712\n",
				"memory/bench/controller/memory.limit_in_bytes": "536870912\n",
			},
			want: 512 * mi,
		},
		{
			name:       "v1, a smaller limit on an ancestor bounds it",
			procCgroup: "4:memory:/pod/ctr\n",
			files: map[string]string{
				"memory/pod/memory.limit_in_bytes":     "268435456\n",
				"memory/pod/ctr/memory.limit_in_bytes": "536870912\n",
			},
			want: 256 * mi,
		},
		{
			name:       "v1, no limit anywhere",
			procCgroup: "4:memory:/process_api/f391\n0::/\n",
			files: map[string]string{
				"memory/memory.limit_in_bytes":                  "9223372036854771712\n",
				"memory/process_api/f391/memory.limit_in_bytes": "9223372036854771712\n",
			},
			want: 0,
		},
		{
			// A container with its own cgroup namespace (cgroup v2, containerd's
			// default): its cgroup is "/", mounted at the root.
			name:       "v2, container's namespace",
			procCgroup: "0::/\n",
			files:      map[string]string{"memory.max": "536870912\n"},
			want:       512 * mi,
		},
		{
			name:       "v2, no limit",
			procCgroup: "0::/kubepods/pod1/ctr\n",
			files:      map[string]string{"kubepods/pod1/ctr/memory.max": "max\n", "kubepods/memory.max": "max\n"},
			want:       0,
		},
		{
			// The process's path as the host names it, which the container's
			// mount does not show: the limit mounted at the root still counts.
			name:       "v1, host path not mounted",
			procCgroup: "4:memory:/kubepods/burstable/pod1/abc\n",
			files:      map[string]string{"memory/memory.limit_in_bytes": "536870912\n"},
			want:       512 * mi,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for rel, content := range tc.files {
				writeFile(t, root, rel, content)
			}
			got, err := Limit([]byte(tc.procCgroup), root)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("Limit = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestLimitErrors(t *testing.T) {
	root := t.TempDir()
	if _, err := Limit([]byte("1:cpu:/\n"), root); err == nil {
		t.Error("no memory hierarchy and no unified one: want an error")
	}
	writeFile(t, root, "memory.max", "lots\n")
	if _, err := Limit([]byte("0::/\n"), root); err == nil {
		t.Error("memory.max is not a number: want an error naming the file")
	}
}

func TestSoft(t *testing.T) {
	if got, want := Soft(512<<20), int64(483183820); got != want {
		t.Errorf("Soft(512Mi) = %d, want %d (90 %%)", got, want)
	}
}
