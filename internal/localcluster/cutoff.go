package localcluster

import (
	"context"
	"io"
	"net/http"
	"sync"

	"k8s.io/client-go/rest"
)

// apiGate is a node's connection to the control plane as the sandbox's cut
// (internal/kubecluster, Node.CutOff) leaves it: a cable pulled in front of a
// proxy that keeps the bytes. While the gate is shut, requests wait to be
// sent and the bytes of responses in flight (a watch's events, a write's
// answer) wait to be read; Reconnect lets them all through, late, as they
// were. Nothing fails by the cut itself: a caller with a deadline gives up.
type apiGate struct {
	mu   sync.Mutex
	open chan struct{} // closed while traffic flows
}

func newAPIGate() *apiGate {
	g := &apiGate{open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *apiGate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

func (g *apiGate) reopen() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// pass waits until traffic flows, or ctx is done.
func (g *apiGate) pass(ctx context.Context) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wrap returns a copy of cfg whose traffic goes through the gate.
func (g *apiGate) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	prev := cfg.WrapTransport
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return gatedTransport{rt: rt, g: g}
	}
	return cfg
}

type gatedTransport struct {
	rt http.RoundTripper
	g  *apiGate
}

func (t gatedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if err := t.g.pass(ctx); err != nil {
		return nil, err
	}
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if err := t.g.pass(ctx); err != nil {
		resp.Body.Close()
		return nil, err
	}
	resp.Body = gatedBody{ReadCloser: resp.Body, g: t.g, ctx: ctx}
	return resp, nil
}

// gatedBody holds what a response brings while the gate is shut, including
// bytes a read already waiting when it shut receives.
type gatedBody struct {
	io.ReadCloser
	g   *apiGate
	ctx context.Context
}

func (b gatedBody) Read(p []byte) (int, error) {
	if err := b.g.pass(b.ctx); err != nil {
		return 0, err
	}
	n, err := b.ReadCloser.Read(p)
	if perr := b.g.pass(b.ctx); perr != nil {
		return 0, perr
	}
	return n, err
}

// CutOff cuts the node's agent off from the control plane while it goes on
// running, as the sandbox's partition does (its DRBD links are Partition's
// business): its requests and the answers to them wait until Reconnect.
func (c *Cluster) CutOff(node string) error {
	n, err := c.named(node)
	if err != nil {
		return err
	}
	n.api.shut()
	return nil
}

// Reconnect ends CutOff: what waited goes through.
func (c *Cluster) Reconnect(node string) error {
	n, err := c.named(node)
	if err != nil {
		return err
	}
	n.api.reopen()
	return nil
}
