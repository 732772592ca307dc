//go:build vmtest

package drbd_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// dmesgSince returns node's kernel log lines after the first skip lines, and
// the count of lines now.
func dmesgSince(t *testing.T, node string, skip int) ([]string, int) {
	t.Helper()
	res, err := cl.nodes[node].Exec(bg, "dmesg")
	if err != nil {
		t.Fatalf("%s: dmesg: %v", node, err)
	}
	lines := strings.Split(strings.TrimRight(string(res.Stdout), "\n"), "\n")
	if skip > len(lines) {
		skip = len(lines)
	}
	return lines[skip:], len(lines)
}

// TestStalePrimaryAfterPartition: node1 is Primary with the product's
// on-no-quorum suspend-io; a partition cuts it off from node2 and node3; its
// write blocks; node2 (quorate with node3) is promoted and writes; then the
// partition heals. What real DRBD 9.2.18 does then is the evidence for
// drbdsim's stale-Primary rule: the stale Primary's suspended write must
// never complete with success, the survivors' data stays, and DRBD detects
// no split brain. Every kernel line and the connection states after the heal
// are logged. Last, node1 is demoted with --force (its IO fails) and
// adjusted, and it resyncs the survivors' data as a Secondary.
//
// It runs last (file order) and leaves the cluster healthy again.
func TestStalePrimaryAfterPartition(t *testing.T) {
	suspend := func(o *drbd.OptionSet) { o.Resource.OnNoQuorum = drbd.Ptr(drbd.OnNoQuorumSuspendIO) }
	healthyTuned(t, suspend)
	marks := map[string]int{}
	for _, n := range []string{"node1", "node2", "node3"} {
		_, marks[n] = dmesgSince(t, n, 1<<30)
	}
	n1, n2 := cl.nodes["node1"], cl.nodes["node2"]
	if err := n1.Primary(bg, r0, drbd.NoForce); err != nil {
		t.Fatal(err)
	}
	before := bytes.Repeat([]byte{1}, 4096)
	if err := n1.Write(bg, r0, 4096, before); err != nil {
		t.Fatalf("node1: write before the partition: %v", err)
	}

	link(true, "node1", "node2")
	link(true, "node1", "node3")
	cut := time.Now()
	waitFor(t, 2*time.Minute, "node1 loses quorum", func() (bool, string) {
		s := st(t, "node1")
		return !s.Devices[0].Quorum, line(s)
	})
	type result struct {
		err error
		at  time.Time
	}
	stale := make(chan result, 1)
	wctx, wcancel := context.WithTimeout(bg, 10*time.Minute)
	defer wcancel()
	go func() {
		err := n1.Write(wctx, r0, 4096, bytes.Repeat([]byte{2}, 4096))
		stale <- result{err, time.Now()}
	}()
	select {
	case r := <-stale:
		t.Fatalf("node1 without quorum: the write returned %v after %s, want it suspended (on-no-quorum suspend-io)", r.err, r.at.Sub(cut).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
	}
	s1 := st(t, "node1")
	t.Logf("node1 cut off, its write suspended: %s suspended:%t suspended-quorum:%t", line(s1), s1.Suspended, s1.SuspendedQuorum)
	if !s1.SuspendedQuorum {
		t.Errorf("node1 without quorum under suspend-io: suspended-quorum:%t, want true", s1.SuspendedQuorum)
	}

	waitFor(t, 2*time.Minute, "node2 quorate with node3", func() (bool, string) {
		s := st(t, "node2")
		return s.Devices[0].Quorum, line(s)
	})
	waitFor(t, 2*time.Minute, "node2 promoted on the majority side", func() (bool, string) {
		err := n2.Primary(bg, r0, drbd.NoForce)
		return err == nil, errString(err)
	})
	newer := bytes.Repeat([]byte{3}, 4096)
	for _, off := range []int64{0, 4096} {
		if err := n2.Write(bg, r0, off, newer); err != nil {
			t.Fatalf("node2, Primary on the majority side: write at %d: %v", off, err)
		}
	}
	t.Logf("node2 promoted and wrote %s after the cut", time.Since(cut).Round(time.Millisecond))

	if err := healAll(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	// Long enough for several connect attempts (connect-int 10 s) and the
	// 17 s after which a healed suspend-io Primary's write completed when
	// nobody had promoted (docs/drbd-quorum.md).
	var done *result
	select {
	case r := <-stale:
		done = &r
	case <-time.After(60 * time.Second):
	}
	for _, n := range []string{"node1", "node2", "node3"} {
		s := st(t, n)
		t.Logf("%s 60 s after the heal: %s suspended:%t suspended-quorum:%t suspended-no-data:%t", n, line(s), s.Suspended, s.SuspendedQuorum, s.SuspendedNoData)
	}
	switch {
	case done == nil:
		t.Logf("node1's suspended write: still pending 60 s after the heal")
	case done.err == nil:
		t.Errorf("node1's suspended write completed %s after the heal: the stale Primary wrote after the majority promoted node2 and wrote", done.at.Sub(healed).Round(time.Millisecond))
	default:
		t.Logf("node1's suspended write failed %s after the heal: %v", done.at.Sub(healed).Round(time.Millisecond), done.err)
	}
	got, err := n2.Read(bg, r0, 4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, newer) {
		t.Errorf("node2 reads %d at 4096 after the heal, want the survivors' %d", got[0], newer[0])
	}
	var all []string
	for _, n := range []string{"node1", "node2", "node3"} {
		lines, _ := dmesgSince(t, n, marks[n])
		for _, l := range lines {
			all = append(all, n+": "+l)
			if strings.Contains(l, "Split-Brain detected") {
				t.Errorf("%s: %s", n, l)
			}
		}
	}
	t.Logf("kernel log from node1's promotion to 60 s after the heal:\n%s", strings.Join(all, "\n"))

	// Recovery as the product would do it once the stale member is
	// detached: node1 demoted with --force (its pending IO fails), the
	// survivors' Primary demoted, adjust everywhere; node1 resyncs node2's
	// data.
	if res, err := n1.Exec(bg, "drbdsetup", "secondary", "--force", r0); err != nil || res.ExitCode != 0 {
		t.Fatalf("node1: drbdsetup secondary --force: %v exit %d: %s", err, res.ExitCode, res.Stderr)
	}
	if done == nil {
		select {
		case r := <-stale:
			if r.err == nil {
				t.Errorf("node1's suspended write completed after its forced demotion")
			} else {
				t.Logf("node1's suspended write after its forced demotion: %v", r.err)
			}
		case <-time.After(time.Minute):
			t.Errorf("node1's suspended write still pending a minute after its forced demotion")
		}
	}
	if err := n2.Secondary(bg, r0); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node1", "node2", "node3"} {
		if err := cl.nodes[n].Adjust(bg, r0); err != nil {
			t.Logf("%s: adjust: %v", n, err)
		}
	}
	for _, n := range []string{"node1", "node2", "node3"} {
		waitFor(t, 3*time.Minute, n+" connected and in sync after the recovery", func() (bool, string) { return settled(n, st(t, n)) })
	}
	var tail []string
	for _, n := range []string{"node1", "node2", "node3"} {
		lines, _ := dmesgSince(t, n, marks[n])
		for _, l := range lines {
			tail = append(tail, n+": "+l)
		}
	}
	t.Logf("kernel log of the whole test, recovery included:\n%s", strings.Join(tail, "\n"))
	// node1 is a Secondary now; its data is read from its backing disk's
	// peer, node2, made Primary for the read.
	if err := n1.Primary(bg, r0, drbd.NoForce); err != nil {
		t.Fatalf("node1: primary after the resync: %v", err)
	}
	defer func() { _ = n1.Secondary(bg, r0) }()
	got, err = n1.Read(bg, r0, 4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, newer) {
		t.Errorf("node1 after the resync reads %d at 4096, want the survivors' %d", got[0], newer[0])
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
