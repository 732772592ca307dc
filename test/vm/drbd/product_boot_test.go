//go:build vmtest

package drbd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
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
// once; every test on the guests waits for the tier first (waitProduct).
//
// The drbdsim pass runs beside all of it, in a process of its own
// (hack/vm-test-drbd.sh starts this binary a second time with
// MESHVOL_VM_SIM_RECORD and `-test.run ^TestProductOnDrbdsim$`): in this
// binary it would hold up the tests on the guests until it ended, and
// under load it took longer than the guests' boot. TestProduct waits for
// its record only when it compares. Without MESHVOL_VM_SIM_RECORD (a
// VM_RUN pattern) TestProductOnDrbdsim runs here first, in name order, as
// before.

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

// simRecordPath is MESHVOL_VM_SIM_RECORD: where the drbdsim pass's own
// process writes its record (simPass) and the product tier's process reads
// it; the script writes simRecordPath+".rc", the pass's exit code, when that
// process has ended.
func simRecordPath() string { return os.Getenv("MESHVOL_VM_SIM_RECORD") }

// simPass says whether this process is the drbdsim pass's own: it has a
// record to write and no guests.
func simPass() bool { return simRecordPath() != "" && productReady == nil }

// TestProductOnDrbdsim is the scenario list on drbdsim, the in-process
// cluster `make test` uses; TestProduct compares its record with the
// guests'. In the pass's own process it writes the record to
// MESHVOL_VM_SIM_RECORD. In the product tier's process it runs only when
// no such process does, and then must come first among the tier's tests,
// which wait for the guests: this file's name sorts before theirs.
func TestProductOnDrbdsim(t *testing.T) {
	switch {
	case simPass():
		ctrllog.SetLogger(logr.New(errorsOnly{}))
	case productReady == nil:
		t.Skip("needs the product tier: VM_SUITE=product make test-drbd-vm")
	case simRecordPath() != "":
		t.Skip("the drbdsim pass runs in its own process (MESHVOL_VM_SIM_RECORD); TestProduct reads its record")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	began := time.Now()
	rec := runOnDrbdsim(ctx, t)
	if simPass() {
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(simRecordPath(), b, 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("product-vm: the drbdsim pass took %s, in its own process\n", time.Since(began).Round(time.Second))
		return
	}
	simRecord = rec
	select {
	case <-productReady:
		fmt.Printf("product-vm: the drbdsim pass took %s; the guests' tier was ready before it ended\n", time.Since(began).Round(time.Second))
	default:
		fmt.Printf("product-vm: the drbdsim pass took %s, while the guests booted\n", time.Since(began).Round(time.Second))
	}
}

// waitSimRecord waits for the drbdsim pass's own process to end and reads
// its record; nil, with the reason logged, when it ended without one (it
// failed: its output is sim-result.txt in the run's directory).
func waitSimRecord(ctx context.Context, t *testing.T) *scenario.Record {
	t.Helper()
	path := simRecordPath()
	began := time.Now()
	for {
		rc, err := os.ReadFile(path + ".rc")
		if err == nil {
			if w := time.Since(began); w > time.Second {
				fmt.Printf("product-vm: waited %s for the drbdsim pass to end\n", w.Round(time.Second))
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("the drbdsim pass ended (exit code %s) without a record: %v", strings.TrimSpace(string(rc)), err)
				return nil
			}
			rec := &scenario.Record{}
			if err := json.Unmarshal(b, rec); err != nil {
				t.Errorf("the drbdsim pass's record %s: %v", path, err)
				return nil
			}
			return rec
		}
		select {
		case <-ctx.Done():
			t.Errorf("the drbdsim pass had not ended (no %s.rc) when TestProduct's time ran out", path)
			return nil
		case <-time.After(time.Second):
		}
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
	// Scenario 6 (partition and heal) runs here too when the pass has a
	// process of its own, beside the guests, where its minute and more costs
	// the run nothing; in the tier's own process (a VM_RUN pattern) it is
	// left out, as it would hold up the tests on the guests, and the
	// comparison lists its steps as real DRBD's only (test/vm/FINDINGS.md,
	// "The product on real DRBD", 11).
	o := scenario.Options{Wait: 2 * time.Minute}
	if !simPass() {
		o.Skip = map[string]bool{"6-partition": true}
	}
	return scenario.Run(ctx, t, l, o)
}
