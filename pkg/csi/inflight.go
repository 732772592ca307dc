package csi

import (
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// inflight is the per-volume guard: the CO may retry a call whose deadline passed
// while the first is still waiting, and two calls for one volume must not race each
// other's creates and deletes. The second gets Aborted, as the spec asks, and the CO
// retries with backoff.
type inflight struct {
	mu   sync.Mutex
	busy map[string]string // volume id → method holding it
}

// acquire takes the volume for method, or returns Aborted naming the call that holds it.
func (g *inflight) acquire(volumeID, method string) (release func(), err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy == nil {
		g.busy = map[string]string{}
	}
	if holder, ok := g.busy[volumeID]; ok {
		return nil, status.Errorf(codes.Aborted, "volume %q: %s is already in progress for it; retry later", volumeID, holder)
	}
	g.busy[volumeID] = method
	return func() {
		g.mu.Lock()
		delete(g.busy, volumeID)
		g.mu.Unlock()
	}, nil
}
