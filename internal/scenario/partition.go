package scenario

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// progressWriter writes files of 256 KiB with fsync into the volume where it
// is published, in the background on that node, and counts the writes that
// completed in a file outside the volume: a frozen volume must not hide the
// count (reading the volume's own files would block with it).
type progressWriter struct {
	r          *run
	node       string
	count, log string
	stopFile   string
}

func (r *run) startProgressWriter(t *testing.T, id string) *progressWriter {
	t.Helper()
	node := r.published[id]
	base := path.Join(r.b.Dir(node), "writer-"+id)
	w := &progressWriter{r: r, node: node, count: base + ".count", log: base + ".log", stopFile: base + ".stop"}
	dir := path.Join(r.target(node, id), "partition-writer")
	// The count is written beside and renamed over the count file, so that a
	// reader never sees it truncated and not yet written: `echo $i >count`
	// empties the file first, and a reader in between read "" (seen on
	// drbdsim, whose writes complete within microseconds).
	loop := fmt.Sprintf(`i=0; while [ ! -e %[2]s ]; do dd if=/dev/urandom of=%[1]s/f$((i %% 16)) bs=64k count=4 conv=fsync 2>/dev/null || { echo "failed: write $i" >>%[3]s; exit 1; }; i=$((i+1)); echo $i >%[4]s.tmp && mv -f %[4]s.tmp %[4]s; done`,
		dir, w.stopFile, w.log, w.count)
	script := fmt.Sprintf(`mkdir -p %[1]s && rm -f %[2]s %[3]s %[4]s && echo 0 >%[4]s && (sh -c '%[5]s' >/dev/null 2>&1 </dev/null &)`, dir, w.stopFile, w.log, w.count, loop)
	if out, err := r.b.Shell(r.ctx, node, script); err != nil {
		t.Fatalf("starting the writer on %s: %v: %s", node, err, out)
	}
	t.Cleanup(func() { _, _ = r.b.Shell(r.ctx, node, "touch "+w.stopFile) })
	return w
}

// completed is how many writes have completed so far, and what the writer
// logged (its failure, if any).
func (w *progressWriter) completed(t *testing.T) (int, string) {
	t.Helper()
	out, err := w.r.b.Shell(w.r.ctx, w.node, "cat "+w.count+"; cat "+w.log+" 2>/dev/null; true")
	if err != nil {
		t.Fatalf("reading the writer's count on %s: %v", w.node, err)
	}
	first, rest, _ := strings.Cut(strings.TrimSpace(out), "\n")
	n, err := strconv.Atoi(first)
	if err != nil {
		t.Fatalf("the writer's count on %s: %q", w.node, out)
	}
	return n, strings.TrimSpace(rest)
}

// endedOrWrote waits until the writer has logged its failure (a write that
// failed ends it) or has completed more than atCut writes, and returns its
// count and log then; it fails the test after Options.Wait.
func (w *progressWriter) endedOrWrote(t *testing.T, atCut int) (int, string) {
	t.Helper()
	deadline := time.Now().Add(w.r.o.Wait)
	for {
		n, log := w.completed(t)
		if n != atCut || strings.Contains(log, "failed") {
			return n, log
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer on %s neither failed nor wrote within %s of the heal (%d writes, log %q): its held write still hangs; %s",
				w.node, w.r.o.Wait, n, log, w.r.kernelOf(w.r.vols["3d"]))
		}
		select {
		case <-w.r.ctx.Done():
			t.Fatal(w.r.ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// Scenario 6: the node holding the Primaries of the 2d-1tb and 3d volumes
// (scenario 8 left both there) is cut off while a writer runs on the 3d
// volume: its DRBD from every peer, its agent from the apiserver. Its
// writes stop completing (on-no-quorum suspend-io: they block); the
// controller declares the node lost; as Kubernetes does for a pod on a lost
// node, each attachment is released and the volume published on a survivor,
// where the fsynced data reads back and a new file is written with fsync.
// Then the partition heals: the old Primary completes no write after the
// cut, ever (its peers refuse it, and its agent, back in touch, fails the
// held writes with on-no-quorum io-error before it demotes: docs/controller.md,
// "The heal: failing a stale Primary's held writes"); DRBD on the survivors
// shows no split brain; the survivors' files read back unchanged; the old
// pod's mount goes and so does the old resource; and both volumes become
// Ready again with their layouts. The figures: time to published
// elsewhere, writes completed on the old Primary after the cut.
func (r *run) partition(t *testing.T) {
	two, three := r.vols["2d-1tb"], r.vols["3d"]
	node := r.published[three]
	if r.published[two] != node {
		t.Fatalf("scenario 8 left %s published on %q, not on %s with %s", two, r.published[two], node, three)
	}
	w := r.startProgressWriter(t, three)
	r.eventually(t, "the writer on "+node+" writes", func() string {
		if n, log := w.completed(t); n < 3 {
			return fmt.Sprintf("%d writes %s", n, log)
		}
		return ""
	})
	cut := time.Now()
	if err := r.b.Partition(r.ctx, node); err != nil {
		t.Fatal(err)
	}
	healed := false
	t.Cleanup(func() {
		if !healed {
			_ = r.b.Heal(r.ctx)
		}
	})
	r.eventually(t, three+" on "+node+" loses quorum", func() string {
		st, err := r.b.DRBD(node).Status(r.ctx, three)
		if err != nil || len(st) != 1 || len(st[0].Devices) != 1 {
			return fmt.Sprintf("drbdsetup status: %v", err)
		}
		if st[0].Devices[0].Quorum {
			return "quorate: " + kernelSummary(st[0], nil)
		}
		return ""
	})
	// A write in flight at the cut completes or not by then; none after.
	time.Sleep(5 * time.Second)
	atCut, _ := w.completed(t)
	r.step(t, "6 "+node+" cut off")

	var to string // a Diskful node of 2d-1tb; every node is one of 3d's
	for _, id := range []string{two, three} {
		r.call(t, "ControllerUnpublishVolume "+id+" from the cut-off "+node, func(ctx context.Context) error {
			_, err := r.b.Controller().ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: node})
			return err
		})
		delete(r.published, id)
		for _, n := range r.diskful(t, id) {
			if n != node && !r.down[n] && to == "" {
				to = n
			}
		}
		r.publish(t, id, to)
		if got := r.checksum(t, id); got != r.sums[id] {
			t.Fatalf("%s: the file fsynced on %s reads back on %s with sha256 %s, want %s", id, node, to, got, r.sums[id])
		}
		r.rec.Figures = append(r.rec.Figures, fmt.Sprintf("6: %s: %s cut off -> published on %s in %s; %d fsynced bytes read back",
			id, node, to, time.Since(cut).Round(100*time.Millisecond), dataBytes))
	}
	// conv=fsync, not sync(1): on drbdsim the nodes share one kernel, where a
	// global sync would wait for the cut-off node's frozen file system.
	after := path.Join(r.target(to, three), "after-partition")
	wctx, wcancel := context.WithTimeout(r.ctx, r.o.Wait)
	out, err := r.b.Shell(wctx, to, fmt.Sprintf("dd if=/dev/urandom of=%s bs=1M count=1 conv=fsync 2>&1", after))
	wcancel()
	if err != nil {
		t.Fatalf("writing on the survivor %s: %v: %s; %s", to, err, out, r.kernelOf(three))
	}
	sumAfter := r.fileSum(t, to, after)
	r.step(t, "6 published on the survivors")

	if err := r.b.Heal(r.ctx); err != nil {
		t.Fatal(err)
	}
	healed = true
	// The old Primary meets the survivors again. Its writer ends only when
	// its held write fails (the returning agent's on-no-quorum io-error,
	// docs/controller.md, "The heal: failing a stale Primary's held
	// writes"), and after that nothing of it can write: wait for that, or
	// for a write completed after the cut (two writers), whichever comes
	// first. A fixed wait here was 45 s of every run.
	n, log := w.endedOrWrote(t, atCut)
	r.step(t, "6 healed")
	if n != atCut {
		t.Fatalf("the old Primary on %s completed %d writes after the cut (%d at the cut, %d after the heal; log %q; %s): two writers",
			node, n-atCut, atCut, n, log, r.kernelOf(three))
	}
	r.rec.Figures = append(r.rec.Figures, fmt.Sprintf("6: the old Primary on %s: %d writes completed before the cut, none after (writer: %q)", node, atCut, log))
	for _, id := range []string{three, two} {
		if got := r.checksum(t, id); got != r.sums[id] {
			t.Fatalf("%s after the heal: the data file reads with sha256 %s on %s, want %s", id, got, to, r.sums[id])
		}
	}
	if got := r.fileSum(t, to, after); got != sumAfter {
		t.Fatalf("after the heal the file written on the survivor %s reads with sha256 %s, want %s", to, got, sumAfter)
	}
	// The kubelet, back in touch, finds the old pods deleted, kills their
	// containers and unmounts their volumes; the agent then takes the
	// force-removed members' DRBD down (docs/controller.md, "Node lifecycle").
	_, _ = r.b.Shell(r.ctx, node, "touch "+w.stopFile+"; pkill -f "+w.stopFile+"; true")
	for _, id := range []string{three, two} {
		r.published[id] = node
		r.unstage(t, id)
		r.published[id] = to
	}
	for _, id := range []string{three, two} {
		r.eventually(t, "the old Primary on "+node+" no longer Primary of "+id, func() string {
			if role := r.role(id, node); role == "Primary" {
				return "still Primary: " + r.kernelOf(id)
			}
			return ""
		})
	}
	r.layoutAs(t, three, Layouts[2])
	r.layoutAs(t, two, Layouts[1])
	for _, id := range []string{three, two} {
		r.noSplitBrain(t, id)
	}
	r.step(t, "6 both volumes Ready again")
}

// noSplitBrain waits until the volume's DRBD resource on every live node
// that runs it is connected to every peer it has configured. DRBD meets a
// split brain by dropping the connection (after-sb-0pri disconnect: both
// ends StandAlone, never retried), so a volume Ready again whose every
// connection is established had none.
func (r *run) noSplitBrain(t *testing.T, id string) {
	t.Helper()
	r.eventually(t, "every connection of "+id+" established (no split brain)", func() string {
		for _, n := range r.b.Nodes() {
			if r.down[n] {
				continue
			}
			st, err := r.b.DRBD(n).Status(r.ctx, id)
			if errors.Is(err, drbd.ErrUnknownResource) || (err == nil && len(st) == 0) {
				continue
			}
			if err != nil {
				return fmt.Sprintf("drbdsetup status on %s: %v", n, err)
			}
			for _, c := range st[0].Connections {
				if c.ConnectionState != "Connected" {
					return n + ": " + kernelSummary(st[0], nil)
				}
			}
		}
		return ""
	})
}

// fileSum is sha256sum's reading of file on node.
func (r *run) fileSum(t *testing.T, node, file string) string {
	t.Helper()
	out, err := r.b.Shell(r.ctx, node, "sha256sum "+file)
	if err != nil {
		t.Fatalf("sha256sum %s on %s: %v", file, node, err)
	}
	sum, _, _ := strings.Cut(strings.TrimSpace(out), " ")
	return sum
}

// kernelOf is DRBD's status of volume id on every node that is up, for messages.
func (r *run) kernelOf(id string) string {
	var out []string
	for _, n := range r.b.Nodes() {
		if r.down[n] {
			continue
		}
		st, err := r.b.DRBD(n).Status(r.ctx, id)
		if err != nil || len(st) != 1 {
			out = append(out, fmt.Sprintf("%s: %v", n, err))
			continue
		}
		out = append(out, n+": "+kernelSummary(st[0], nil))
	}
	return strings.Join(out, "; ")
}
