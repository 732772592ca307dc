package contract_test

import (
	"os"
	"testing"

	"github.com/meshvol/meshvol/pkg/drbd/internal/captures"
)

// TestMain says how much of the capture tree the suite compared against.
func TestMain(m *testing.M) { os.Exit(captures.Main(m, "contract")) }
