package drbd

import (
	"fmt"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	renderHook = checker.record
	code := m.Run()
	summary, ok := checker.finish()
	fmt.Println(summary)
	if !ok && code == 0 {
		code = 1
	}
	os.Exit(code)
}
