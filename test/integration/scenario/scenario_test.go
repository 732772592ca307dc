// Package scenario_test runs the product's scenario list (internal/scenario)
// on drbdsim: the in-process cluster with the CSI services, as `make test`
// runs it. The VM tier runs the same list on real DRBD 9.2.18
// (test/vm/README.md) and compares the two runs step by step.
package scenario_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/meshvol/meshvol/internal/scenario"
	"github.com/meshvol/meshvol/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("SKIP: the scenarios' file pools and mounts need root")
		os.Exit(0)
	}
	os.Exit(testenv.Main(m, &env, testenv.Options{}))
}

func TestScenarios(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	l, err := scenario.StartLocal(ctx, env, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	}()
	rec := scenario.Run(ctx, t, l, scenario.Options{Wait: 2 * time.Minute})
	var b strings.Builder
	rec.Print(&b)
	t.Log("\n" + b.String())
}
