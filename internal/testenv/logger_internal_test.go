package testenv

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// Main's default logger keeps reconciler errors in the test output and
// drops their info lines, also on loggers derived with names and values.
func TestErrorsOnlyLogger(t *testing.T) {
	var lines []string
	log := logr.New(errorsOnly{funcr.New(func(prefix, args string) {
		lines = append(lines, prefix+" "+args)
	}, funcr.Options{}).GetSink()})

	log.Info("starting")
	log.V(1).Info("detail")
	derived := log.WithName("rv-controller").WithValues("rv", "pvc-1")
	derived.Info("reconciled")
	derived.Error(errors.New("quorum lost"), "reconcile failed")

	if len(lines) != 1 {
		t.Fatalf("logged %d lines, want only the error: %q", len(lines), lines)
	}
	for _, want := range []string{"rv-controller", "pvc-1", "quorum lost", "reconcile failed"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("error line %q lacks %q", lines[0], want)
		}
	}
}
