//go:build vmtest

package drbd_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/meshvol/meshvol/internal/scenario"
)

// The product tier's start: the guests boot under emulation for one to
// five minutes, and the scenario list's drbdsim pass needs none of them.
// So TestMain starts the tier (waiting for the guests, then the control
// plane, controller and agents) in the background and runs the tests at
// once: TestProductOnDrbdsim, first in name order, runs the drbdsim pass
// meanwhile, and every test on the guests waits for the tier first
// (waitProduct).

var (
	// productReady is closed when the background start has ended, with
	// prod set or productErr saying why not; nil outside the product tier.
	productReady chan struct{}
	productErr   error
	// simRecord is TestProductOnDrbdsim's record, which TestProduct
	// compares with the guests'.
	simRecord *scenario.Record
)

// runProductTier is TestMain for the product tier: m.Run beside the tier's
// start, then the tier's end. A start that failed fails every test on the
// guests and the binary.
func runProductTier(m *testing.M, spec, out, meshvol string) int {
	ctrllog.SetLogger(logr.New(errorsOnly{}))
	productReady = make(chan struct{})
	go func() {
		defer close(productReady)
		p, err := startProduct(spec, out, meshvol)
		if err != nil {
			productErr = fmt.Errorf("product tier setup: %w", err)
			fmt.Fprintln(os.Stderr, productErr)
			return
		}
		prod = p
	}()
	code := m.Run()
	<-productReady
	if prod != nil {
		prod.finish()
	}
	if productErr != nil {
		code = 2
	}
	return code
}

// waitProduct skips outside the product tier, waits for the tier's start
// and fails the test if it failed.
func waitProduct(t *testing.T) {
	t.Helper()
	if productReady == nil {
		t.Skip("needs the product tier: VM_SUITE=product make test-drbd-vm")
	}
	<-productReady
	if productErr != nil {
		t.Fatal(productErr)
	}
}

// TestProductOnDrbdsim is the scenario list on drbdsim, the in-process
// cluster `make test` uses, run while the guests boot; TestProduct compares
// its record with the guests'. It must come first among the product tier's
// tests, which wait for the guests: this file's name sorts before theirs.
func TestProductOnDrbdsim(t *testing.T) {
	if productReady == nil {
		t.Skip("needs the product tier: VM_SUITE=product make test-drbd-vm")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	began := time.Now()
	simRecord = runOnDrbdsim(ctx, t)
	select {
	case <-productReady:
		fmt.Printf("product-vm: the drbdsim pass took %s; the guests' tier was ready before it ended\n", time.Since(began).Round(time.Second))
	default:
		fmt.Printf("product-vm: the drbdsim pass took %s, while the guests booted\n", time.Since(began).Round(time.Second))
	}
}

// runOnDrbdsim runs the scenario list on a fresh in-process drbdsim cluster
// and stops it.
func runOnDrbdsim(ctx context.Context, t *testing.T) *scenario.Record {
	l, err := scenario.StartLocal(ctx, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Stop(); err != nil {
			t.Errorf("stopping the drbdsim cluster: %v", err)
		}
	}()
	// Scenario 6 runs on drbdsim in `make test` (test/integration/scenario);
	// here it is left out of the drbdsim pass, which would add its minute and
	// more to a tier that must stay short, and the comparison lists its steps
	// as real DRBD's only (test/vm/FINDINGS.md, "The product on real DRBD", 11).
	return scenario.Run(ctx, t, l, scenario.Options{Wait: 2 * time.Minute, Skip: map[string]bool{"6-partition": true}})
}
