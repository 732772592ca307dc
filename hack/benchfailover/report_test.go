package main

import (
	"strings"
	"testing"
	"time"
)

func TestQuantileNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 20; i++ {
		ds = append(ds, time.Duration(i)*time.Second)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 10 * time.Second}, {0.95, 19 * time.Second}, {1, 20 * time.Second}, {0, time.Second}} {
		if got := quantile(ds, c.q); got != c.want {
			t.Errorf("quantile(1..20 s, %v) = %s, want %s", c.q, got, c.want)
		}
	}
	if got := quantile(ds[:1], 0.95); got != time.Second {
		t.Errorf("quantile of one = %s", got)
	}
}

// A milestone seen before the one it follows adds nothing to the bar, and
// the parts add up to the run's total.
func TestPartsAddUpToTotal(t *testing.T) {
	r := run{Detected: 8 * time.Second, PodDeleted: 8200 * time.Millisecond, Detached: 8100 * time.Millisecond,
		Primary: 9 * time.Second, Attached: 9500 * time.Millisecond, Running: 11 * time.Second, Total: 11300 * time.Millisecond}
	parts := r.parts()
	if len(parts) != len(segments) {
		t.Fatalf("%d parts for %d segments", len(parts), len(segments))
	}
	var sum time.Duration
	for i, p := range parts {
		if p < 0 {
			t.Errorf("part %d (%s) is negative: %s", i, segments[i].name, p)
		}
		sum += p
	}
	if sum != r.Total {
		t.Errorf("parts add up to %s, the total is %s", sum, r.Total)
	}
	if parts[2] != 0 {
		t.Errorf("the VolumeAttachment deleted before the pod adds %s, want 0", parts[2])
	}
}

func TestSVGHasABarPerRun(t *testing.T) {
	rep := &report{Commit: "abc<1>", Goal: 15 * time.Second, Runs: []run{
		{Name: "fo-01", Total: 10 * time.Second, Detected: 8 * time.Second},
		{Name: "fo-02", Total: 16 * time.Second, Detected: 9 * time.Second},
	}}
	svg := rep.svg()
	if n := strings.Count(svg, "<rect "); n != 2*len(segments)+len(segments) {
		t.Errorf("%d rects, want %d (a bar of %d segments per run, and the legend)", n, 3*len(segments), len(segments))
	}
	if strings.Contains(svg, "abc<1>") || !strings.Contains(svg, "abc&lt;1&gt;") {
		t.Error("the commit is not escaped")
	}
	if !strings.Contains(rep.summary(), "1 at or over the 15s goal; 0 failed") {
		t.Errorf("summary: %s", rep.summary())
	}
}

// The chart's leader-election values are read as the sandbox installs them.
func TestChartLeaderElectionIsRead(t *testing.T) {
	le := chartLeaderElection("../..")
	parts := strings.Split(le, "/")
	if len(parts) != 3 {
		t.Fatalf("chartLeaderElection = %q, want leaseDuration/renewDeadline/retryPeriod", le)
	}
	for _, p := range parts {
		if _, err := time.ParseDuration(p); err != nil {
			t.Errorf("chartLeaderElection = %q: %q is not a duration: %v", le, p, err)
		}
	}
}

// Runs are grouped by whether a leader the failover waits for (meshvol's,
// external-attacher's) ran on the faulted node; another sidecar's does not
// count, and a failed run is in neither group.
func TestByLeaderGroupsRuns(t *testing.T) {
	rep := &report{Runs: []run{
		{Name: "fo-01", Total: 20 * time.Second, Detected: 18 * time.Second, Leaders: []string{"meshvol", "provisioner"}},
		{Name: "fo-02", Total: 12 * time.Second, Detected: 9 * time.Second, Leaders: []string{"attacher"}},
		{Name: "fo-03", Total: 10 * time.Second, Detected: 8 * time.Second, Leaders: []string{"snapshotter"}},
		{Name: "fo-04", Error: "boom", Leaders: []string{"meshvol"}},
	}}
	got := rep.byLeader()
	want := "leader: 2, fault → first write min 12.00 s, median 12.00 s, p95 20.00 s, max 20.00 s"
	if !strings.Contains(got, want) || !strings.Contains(got, "the others: 1, fault → first write min 10.00 s") {
		t.Errorf("byLeader() = %q\nwant it to contain %q and one other run of 10 s", got, want)
	}
	for lease, role := range map[string]string{"meshvol-controller": "meshvol", "csi-meshvol-io": "provisioner",
		"external-attacher-leader-csi-meshvol-io": "attacher", "snapshot-controller-leader": "snapshot-controller-leader"} {
		if got := leaderRole(lease); got != role {
			t.Errorf("leaderRole(%q) = %q, want %q", lease, got, role)
		}
	}
}
