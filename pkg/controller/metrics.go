package controller

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Scheme returns the scheme the controller needs: Kubernetes' built-in kinds and
// meshvol's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1.AddToScheme(s))
	return s
}

var (
	writesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshvol_controller_writes_total",
		Help: "Apiserver writes made by the meshvol controller's reconcilers, by kind and verb (create, delete, update, patch, apply, status-apply).",
	}, []string{"kind", "verb"})
	placementFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshvol_controller_placement_failures_total",
		Help: "Placement decisions that found no node, by the constraint that failed.",
	}, []string{"constraint"})
	phaseChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshvol_controller_volume_phase_changes_total",
		Help: "Volume phase changes written, by the phase entered.",
	}, []string{"phase"})
)

func init() {
	// controller-runtime's registry is what its metrics endpoint serves, next to its own
	// reconcile counters (controller_runtime_reconcile_errors_total and friends).
	metrics.Registry.MustRegister(writesTotal, placementFailures, phaseChanges, agentsSilent)
}

// Write is one apiserver write a reconciler made.
type Write struct {
	Kind, Name, Verb string
}

// countingClient counts the writes made through it. Reads pass through to the cache.
type countingClient struct {
	client.Client
	scheme  *runtime.Scheme
	onWrite func(Write)
}

// count records one write; a request the apiserver refused (a conflict, a validation
// error) changed nothing and is not a write: the reconcile error metrics count those.
func (c *countingClient) count(obj client.Object, verb string, err error) {
	if err != nil {
		return
	}
	kind := obj.GetObjectKind().GroupVersionKind().Kind
	if kind == "" {
		if gvk, err := apiutil.GVKForObject(obj, c.scheme); err == nil {
			kind = gvk.Kind
		}
	}
	writesTotal.WithLabelValues(kind, verb).Inc()
	if c.onWrite != nil {
		c.onWrite(Write{Kind: kind, Name: obj.GetName(), Verb: verb})
	}
}

func (c *countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	err := c.Client.Create(ctx, obj, opts...)
	c.count(obj, "create", err)
	return err
}

func (c *countingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	err := c.Client.Delete(ctx, obj, opts...)
	c.count(obj, "delete", err)
	return err
}

func (c *countingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	err := c.Client.Update(ctx, obj, opts...)
	c.count(obj, "update", err)
	return err
}

func (c *countingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	err := c.Client.Patch(ctx, obj, patch, opts...)
	verb := "patch"
	if patch == client.Apply {
		verb = "apply"
	}
	c.count(obj, verb, err)
	return err
}

func (c *countingClient) Status() client.SubResourceWriter {
	return &countingStatus{SubResourceWriter: c.Client.Status(), c: c}
}

type countingStatus struct {
	client.SubResourceWriter
	c *countingClient
}

func (s *countingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	err := s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
	verb := "status-patch"
	if patch == client.Apply {
		verb = "status-apply"
	}
	s.c.count(obj, verb, err)
	return err
}

func (s *countingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	err := s.SubResourceWriter.Update(ctx, obj, opts...)
	s.c.count(obj, "status-update", err)
	return err
}

// onceErr runs a function until it first succeeds.
type onceErr struct {
	mu   sync.Mutex
	done bool
}

func (o *onceErr) do(f func() error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return nil
	}
	if err := f(); err != nil {
		return err
	}
	o.done = true
	return nil
}
