package localcluster

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
)

// Writes counts the apiserver writes (every request but GET) of each
// component of the cluster — "controller", "agent" — by resource, e.g.
// "agent PATCH replicatedvolumereplicas/status". The integration suite prints
// them per operation; they are counted at the HTTP layer, so nothing a
// component does escapes the count.
type Writes struct {
	mu sync.Mutex
	n  map[string]int
}

// Snapshot returns a copy of the counts.
func (w *Writes) Snapshot() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.n)
}

// Since returns the counts that grew after before (a Snapshot), and their total.
func (w *Writes) Since(before map[string]int) (map[string]int, int) {
	now := w.Snapshot()
	out := map[string]int{}
	total := 0
	for k, v := range now {
		if d := v - before[k]; d > 0 {
			out[k] = d
			total += d
		}
	}
	return out, total
}

// Format renders counts one per line, sorted.
func Format(counts map[string]int) string {
	var lines []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		lines = append(lines, fmt.Sprintf("%4d %s", counts[k], k))
	}
	return strings.Join(lines, "\n")
}

func (w *Writes) add(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == nil {
		w.n = map[string]int{}
	}
	w.n[key]++
}

// counted returns a copy of cfg whose requests are counted under component.
func (w *Writes) counted(cfg *rest.Config, component string) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	prev := cfg.WrapTransport
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return countingTransport{rt: rt, w: w, component: component}
	}
	return cfg
}

type countingTransport struct {
	rt        http.RoundTripper
	w         *Writes
	component string
}

func (t countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet {
		t.w.add(t.component + " " + req.Method + " " + resourceOf(req.URL.Path))
	}
	return t.rt.RoundTrip(req)
}

// resourceOf reduces an API path to "resource" or "resource/subresource":
// /apis/g/v/namespaces/ns/leases/name → leases;
// /apis/g/v/replicatedvolumereplicas/name/status → replicatedvolumereplicas/status.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) > 0 && parts[0] == "api":
		parts = parts[min(2, len(parts)):]
	case len(parts) > 0 && parts[0] == "apis":
		parts = parts[min(3, len(parts)):]
	}
	if len(parts) >= 2 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return path
	case 1, 2:
		return parts[0]
	default:
		return parts[0] + "/" + parts[2]
	}
}
