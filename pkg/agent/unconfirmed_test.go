package agent_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/meshvol/meshvol/pkg/agent"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
)

// logLines collects an agent's log lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, prefix+" "+args)
}

// matching are the lines holding every one of parts.
func (l *logLines) matching(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// An Attach whose promotion DRBD refuses leaves the revision unconfirmed, and
// the agent says why in its log as well as in the replica's condition: once,
// not at every retry, and the refusal's own words. The condition vanishes with
// the replica; the log is what explains an attachment that never completed.
func TestRefusedPromotionIsLogged(t *testing.T) {
	logs := &logLines{}
	r := newRig(t, 3, func(c *agent.Config) { c.Log = funcr.New(logs.add, funcr.Options{}) })
	names := r.form3D()
	refusal := "r: State change failed: (-2) Need access to UpToDate data"
	r.node(1).Sim.InjectFault("primary", drbdsim.Fault{Err: errors.New(refusal)})
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[1].Attached = true })
	want := []string{"datamesh revision not confirmed yet", names[1], fmt.Sprintf(`"revision"=%d`, rev), "Promotion refused", "Need access to UpToDate data"}
	r.eventually("the refused promotion logged", 30*time.Second, func() string {
		if len(logs.matching(want...)) == 0 {
			return "no line with " + strings.Join(want, ", ")
		}
		return ""
	})
	// The promotion is retried every RetryInterval (2 s by default); the same
	// refusal is not logged again.
	time.Sleep(5 * time.Second)
	if got := logs.matching(want...); len(got) != 1 {
		t.Fatalf("the refused promotion was logged %d times, want once:\n%s", len(got), strings.Join(got, "\n"))
	}
	if o := r.rvr(names[1]); o.Status.DatameshRevision >= rev {
		t.Fatalf("%s confirmed revision %d while its promotion is refused", names[1], o.Status.DatameshRevision)
	}
	r.node(1).Sim.ClearFault("primary")
	r.confirmed(rev, "", names...)
	if o := r.rvr(names[1]); o.Status.Role != v1.RolePrimary {
		t.Fatalf("%s role %s once the promotion may go through, want Primary", names[1], o.Status.Role)
	}
}
