package controller

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/pkg/crdschema"
)

// CheckCRDs reads each of meshvol's CRDs from the apiserver (a get by name) and
// returns an error unless every one keeps every field of this tree's
// (crdschema.Check): a *crdschema.StaleError naming each CRD, the fields it lacks and
// the command that installs this version's, or the read's error. helm upgrade leaves
// crds/ alone, and the apiserver drops the fields an earlier CRD lacks without an
// error: a member's port, a derived shared secret's derivation, a replica's backing
// volume. The controller writes to every kind, so it checks them all, before it takes
// part in the leader election (docs/controller.md, "Start"; docs/install.md,
// "Upgrading").
func CheckCRDs(ctx context.Context, r client.Reader) error {
	names, err := crdschema.All()
	if err != nil {
		return err
	}
	return crdschema.Check(ctx, r, names)
}

// crdCheckTimeout bounds the check at a manager's start: seven reads.
const crdCheckTimeout = 30 * time.Second

// checkedManager is the manager NewManager returns: Start checks the installed CRDs
// (CheckCRDs) before the manager starts anything — its caches, the leader election,
// the reconcilers — and returns the check's error instead of starting on a CRD that
// would drop fields. A rolling upgrade whose CRDs were not applied then stalls with
// the earlier controller still leading.
type checkedManager struct {
	ctrl.Manager
}

func (m checkedManager) Start(ctx context.Context) error {
	c, cancel := context.WithTimeout(ctx, crdCheckTimeout)
	err := CheckCRDs(c, m.GetAPIReader())
	cancel()
	switch {
	case err != nil && ctx.Err() != nil:
		return nil // stopped before it started, as a manager stopped returns
	case err != nil:
		return err
	}
	return m.Manager.Start(ctx)
}
