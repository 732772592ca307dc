package drbd

import (
	"fmt"
	"os"
	"testing"

	"github.com/meshvol/meshvol/pkg/drbd/internal/captures"
)

func TestMain(m *testing.M) {
	renderHook = checker.record
	code := m.Run()
	summary, ok := checker.finish()
	fmt.Println(summary)
	fmt.Println(captures.Report("drbd"))
	if !ok && code == 0 {
		code = 1
	}
	os.Exit(code)
}
