package scenario

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
)

// Layout is a protection layout and the class the scenarios create for it.
type Layout struct {
	// Name is the layout's short name, also its class's name: 1d, 2d-1tb, 3d.
	Name      string
	FTT, GMDR int32
	// Diskful and TieBreakers are the members the layout places.
	Diskful, TieBreakers int
}

// Layouts are the three layouts of docs/datamesh.md the scenarios cover; 2d-1tb
// is the default class's.
var Layouts = []Layout{
	{Name: "1d", FTT: 0, GMDR: 0, Diskful: 1},
	{Name: "2d-1tb", FTT: 1, GMDR: 0, Diskful: 2, TieBreakers: 1},
	{Name: "3d", FTT: 1, GMDR: 1, Diskful: 3},
}

// VolumeSize is every scenario volume's size: large enough for ext4, small
// enough that a full resync under software emulation takes seconds.
const VolumeSize = 64 << 20

// Options tune a run to its backend.
type Options struct {
	// Wait bounds every wait for the cluster to converge (a volume Ready,
	// an attachment): seconds on drbdsim, minutes under emulation.
	Wait time.Duration
	// Skip names scenarios to leave out ("10-retype"): a new scenario joins
	// the VM tier's default list once it has passed twice in a row there.
	Skip map[string]bool
	// Only, when set, names the only scenarios to run, in the list's order
	// (a pass on a second pool runs those that form, attach, write, move,
	// grow and delete volumes).
	Only []string
	// Prefix goes before the name of every class the run creates, and so
	// of every volume: a second pass in the same cluster (on another pool)
	// meets none of the first pass's objects.
	Prefix string
	// Inspect, when set, runs before scenario 9 with the ids of the
	// volumes the run made: the backend's own look at what lies under
	// them (the VM tier's LVM thin volumes).
	Inspect func(t *testing.T, volumes []string)
}

// run is one pass of the scenario list.
type run struct {
	t   *testing.T
	ctx context.Context
	b   Backend
	o   Options
	rec *Record

	vols      map[string]string            // layout → volume id
	extra     []string                     // volumes of a single scenario, recorded while they exist
	secrets   map[string]string            // volume id → its Secret's name
	published map[string]string            // volume id → node it is published on
	sums      map[string]string            // volume id → checksum of the file written
	pubCtx    map[string]map[string]string // volume id → its publish context
	down      map[string]bool              // nodes crashed by scenario 5
}

// Run runs the scenario list — 1 create, 2 publish and write, 3 move, 4
// expand, 7 agent restart, 8 protection change, 10 retype, 6 partition, 5
// crash (the crashed node stays down), 9 delete —
// each as a subtest, stopping at the first that fails, and returns what
// every step looked like.
func Run(ctx context.Context, t *testing.T, b Backend, o Options) *Record {
	if o.Wait == 0 {
		o.Wait = 2 * time.Minute
	}
	r := &run{t: t, ctx: ctx, b: b, o: o, rec: &Record{Backend: b.Name()},
		vols: map[string]string{}, secrets: map[string]string{}, published: map[string]string{}, sums: map[string]string{}, pubCtx: map[string]map[string]string{}, down: map[string]bool{}}
	type scenario struct {
		name string
		fn   func(t *testing.T)
	}
	for _, s := range []scenario{
		{"1-create", r.create},
		{"2-publish-write", r.publishWrite},
		{"3-move", r.move},
		{"4-expand", r.expand},
		{"7-agent-restart", r.agentRestart},
		{"8-protection-change", r.protectionChange},
		{"10-retype", r.retype},
		{"6-partition", r.partition},
		{"5-crash", r.crash},
		{"9-delete", r.delete},
	} {
		if o.Skip[s.name] || (len(o.Only) > 0 && !slices.Contains(o.Only, s.name)) {
			continue
		}
		began := time.Now()
		ok := t.Run(s.name, s.fn)
		r.rec.Times = append(r.rec.Times, Timing{s.name, time.Since(began)})
		if !ok {
			break
		}
	}
	return r.rec
}

func (r *run) volumes() []string {
	var out []string
	for _, l := range Layouts {
		if v, ok := r.vols[l.Name]; ok {
			out = append(out, v)
		}
	}
	return append(out, r.extra...)
}

// step records what every replica looks like now.
func (r *run) step(t *testing.T, name string) {
	t.Helper()
	s, err := snapshot(r.ctx, r.b, name, r.volumes(), r.down)
	if err != nil {
		t.Fatalf("recording step %s: %v", name, err)
	}
	r.rec.Steps = append(r.rec.Steps, s)
}

// eventually polls cond (empty: satisfied) until it holds or Options.Wait passes.
func (r *run) eventually(t *testing.T, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(r.o.Wait)
	last := ""
	for {
		if last = cond(); last == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, r.o.Wait, last)
		}
		select {
		case <-r.ctx.Done():
			t.Fatalf("%s: %v (last: %s)", what, r.ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// call makes a CSI call as a sidecar or the kubelet would: each attempt with
// its own deadline, retried while the service says to retry (Aborted,
// Unavailable, DeadlineExceeded), until Options.Wait passes.
func (r *run) call(t *testing.T, what string, fn func(ctx context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(r.o.Wait)
	for {
		ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
		err := fn(ctx)
		cancel()
		if err == nil {
			return
		}
		switch status.Code(err) {
		case codes.Aborted, codes.Unavailable, codes.DeadlineExceeded:
			if time.Now().Before(deadline) && r.ctx.Err() == nil {
				time.Sleep(time.Second)
				continue
			}
		}
		t.Fatalf("%s: %v", what, err)
	}
}

var mountCap = &csipb.VolumeCapability{
	AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
	AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

func (r *run) rv(t *testing.T, id string) *v1.ReplicatedVolume {
	t.Helper()
	rv := &v1.ReplicatedVolume{}
	if err := r.b.Client().Get(r.ctx, client.ObjectKey{Name: id}, rv); err != nil {
		t.Fatal(err)
	}
	return rv
}

// Scenario 1: CreateVolume for each layout; each reaches Ready with q/qmr and
// member types as the layout says, read from the kernel.
func (r *run) create(t *testing.T) {
	for _, l := range Layouts {
		r.createClass(t, l)
	}
	for _, l := range Layouts {
		r.vols[l.Name] = r.createVolume(t, l.Name, mountCap)
	}
	for _, l := range Layouts {
		r.ready(t, l)
	}
	r.step(t, "1 created")
}

// class is the name the run gives the class name (Options.Prefix).
func (r *run) class(name string) string { return r.o.Prefix + name }

// createClass creates the class of layout l, named as l (Options.Prefix).
func (r *run) createClass(t *testing.T, l Layout) {
	t.Helper()
	rsc := &v1.ReplicatedStorageClass{ObjectMeta: metav1.ObjectMeta{Name: r.class(l.Name)}}
	rsc.Spec.StoragePool = r.b.Pool()
	ftt, gmdr := l.FTT, l.GMDR
	rsc.Spec.FailuresToTolerate, rsc.Spec.GuaranteedMinimumDataRedundancy = &ftt, &gmdr
	rsc.Spec.Topology = v1.TopologyIgnored
	if err := r.b.Client().Create(r.ctx, rsc); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// createVolume is external-provisioner's CreateVolume of a volume of the
// run's class (Options.Prefix) with capability c; it returns the volume's id.
func (r *run) createVolume(t *testing.T, class string, c *csipb.VolumeCapability) string {
	t.Helper()
	var resp *csipb.CreateVolumeResponse
	classSeen := time.Now().Add(time.Minute)
	class = r.class(class)
	r.call(t, "CreateVolume "+class, func(ctx context.Context) (err error) {
		resp, err = r.b.Controller().CreateVolume(ctx, &csipb.CreateVolumeRequest{
			Name:               "pvc-scenario-" + class,
			CapacityRange:      &csipb.CapacityRange{RequiredBytes: VolumeSize},
			VolumeCapabilities: []*csipb.VolumeCapability{c},
			Parameters:         map[string]string{v1.CSIParameterStorageClass: class},
		})
		// The CSI controller reads classes from its informer, which
		// may not have seen the class created a moment ago; on a
		// cluster the class exists long before its first volume.
		if status.Code(err) == codes.InvalidArgument && strings.Contains(err.Error(), "does not exist") && time.Now().Before(classSeen) {
			return status.Error(codes.Unavailable, err.Error())
		}
		// No room now (a node whose agent missed its Lease renewals
		// under load counts as not live) is a reason to try again
		// later, as external-provisioner does with every failed
		// CreateVolume; call gives up after Options.Wait.
		if status.Code(err) == codes.ResourceExhausted {
			return status.Error(codes.Unavailable, err.Error())
		}
		return err
	})
	return resp.GetVolume().GetVolumeId()
}

// ready waits until the layout's volume is Ready and checks it against the kernel.
func (r *run) ready(t *testing.T, l Layout) {
	t.Helper()
	id := r.vols[l.Name]
	var rv *v1.ReplicatedVolume
	r.eventually(t, id+" Ready", func() string {
		rv = r.rv(t, id)
		if rv.Status.Phase != v1.VolumePhaseReady || len(rv.Status.DatameshTransitions) > 0 {
			return fmt.Sprintf("phase %q, %d transitions", rv.Status.Phase, len(rv.Status.DatameshTransitions))
		}
		return ""
	})
	dm := rv.Status.Datamesh
	// Only a Secret of the volume's own goes with it; the cluster key a derived
	// secret names stays (docs/contract.md, "The shared secret").
	if ss := dm.SharedSecret; ss != nil && ss.Derivation == "" {
		r.secrets[id] = ss.SecretName
	}
	count := map[v1.MemberType]int{}
	for _, m := range dm.Members {
		count[m.Type]++
	}
	if count[v1.MemberTypeDiskful] != l.Diskful || count[v1.MemberTypeTieBreaker] != l.TieBreakers || len(dm.Members) != l.Diskful+l.TieBreakers {
		t.Fatalf("%s (%s): members %v, want %d Diskful and %d TieBreaker", id, l.Name, count, l.Diskful, l.TieBreakers)
	}
	for _, m := range dm.Members {
		r.eventually(t, fmt.Sprintf("%s on %s as the datamesh says", id, m.NodeName), func() string {
			return r.kernelMatches(rv, m)
		})
	}
}

// kernelMatches compares what DRBD runs for member m with the datamesh: a
// disk for a Diskful member and none for a TieBreaker, the quorum and
// quorum-minimum-redundancy of the datamesh, quorum held, every other
// member connected and UpToDate where it has a disk.
func (r *run) kernelMatches(rv *v1.ReplicatedVolume, m v1.DatameshMember) string {
	drv := r.b.DRBD(m.NodeName)
	show, err := drv.Show(r.ctx, rv.Name)
	if err != nil || len(show) != 1 {
		return fmt.Sprintf("drbdsetup show: %v (%d resources)", err, len(show))
	}
	opts := show[0].Options
	dm := rv.Status.Datamesh
	// A voter runs the datamesh's q; a member that does not vote (a
	// TieBreaker) runs layout.NonVoterQuorum, which it can never reach on
	// its own (docs/datamesh.md).
	wantQ := layout.NonVoterQuorum
	if m.Type.IsVoter() {
		wantQ = int(dm.Quorum)
	}
	if got, want := opts["quorum"], strconv.Itoa(wantQ); got != want {
		return fmt.Sprintf("%s member: quorum %q, want %s (datamesh q %d)", m.Type, got, want, dm.Quorum)
	}
	if got, want := opts["quorum-minimum-redundancy"], strconv.Itoa(int(dm.QuorumMinimumRedundancy)); got != want {
		return fmt.Sprintf("quorum-minimum-redundancy %q, the datamesh says %s", got, want)
	}
	vols := show[0].ThisHost.Volumes
	if len(vols) != 1 {
		return fmt.Sprintf("%d volumes", len(vols))
	}
	if diskless := vols[0].Disk.None; diskless != (m.Type != v1.MemberTypeDiskful) {
		return fmt.Sprintf("a %s member with diskless=%v", m.Type, diskless)
	}
	st, err := drv.Status(r.ctx, rv.Name)
	if err != nil || len(st) != 1 || len(st[0].Devices) != 1 {
		return fmt.Sprintf("drbdsetup status: %v", err)
	}
	d := st[0].Devices[0]
	if !d.Quorum {
		return "no quorum: " + kernelSummary(st[0], nil)
	}
	want := "UpToDate"
	if m.Type != v1.MemberTypeDiskful {
		want = "Diskless"
	}
	if d.DiskState != want {
		return "disk " + d.DiskState + ": " + kernelSummary(st[0], nil)
	}
	if len(st[0].Connections) != len(dm.Members)-1 {
		return fmt.Sprintf("%d connections for %d members: %s", len(st[0].Connections), len(dm.Members), kernelSummary(st[0], nil))
	}
	for _, c := range st[0].Connections {
		if c.ConnectionState != "Connected" {
			return kernelSummary(st[0], nil)
		}
	}
	return ""
}

// Paths of a volume on a node, as the kubelet lays them out.
func (r *run) staging(node, id string) string {
	return path.Join(r.b.Dir(node), "staging", id)
}

func (r *run) target(node, id string) string {
	return path.Join(r.b.Dir(node), "target", id)
}

// publish is what Kubernetes does to start a pod using the volume on node:
// ControllerPublish (external-attacher), NodeStage and NodePublish (kubelet).
func (r *run) publish(t *testing.T, id, node string) {
	t.Helper()
	var pub *csipb.ControllerPublishVolumeResponse
	r.call(t, "ControllerPublishVolume "+id+" on "+node, func(ctx context.Context) (err error) {
		pub, err = r.b.Controller().ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{
			VolumeId: id, NodeId: node, VolumeCapability: mountCap})
		return err
	})
	r.published[id] = node
	r.pubCtx[id] = pub.GetPublishContext()
	r.stage(t, id)
}

// stage is the kubelet's part of starting a pod: NodeStage and NodePublish.
func (r *run) stage(t *testing.T, id string) {
	t.Helper()
	node := r.published[id]
	ns := r.b.NodeService(node)
	r.call(t, "NodeStageVolume "+id+" on "+node, func(ctx context.Context) error {
		_, err := ns.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, PublishContext: r.pubCtx[id],
			StagingTargetPath: r.staging(node, id), VolumeCapability: mountCap})
		return err
	})
	r.call(t, "NodePublishVolume "+id+" on "+node, func(ctx context.Context) error {
		_, err := ns.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, PublishContext: r.pubCtx[id],
			StagingTargetPath: r.staging(node, id), TargetPath: r.target(node, id), VolumeCapability: mountCap})
		return err
	})
}

// unstage is the kubelet's part of stopping a pod: NodeUnpublish, NodeUnstage.
func (r *run) unstage(t *testing.T, id string) {
	t.Helper()
	node := r.published[id]
	ns := r.b.NodeService(node)
	r.call(t, "NodeUnpublishVolume "+id+" on "+node, func(ctx context.Context) error {
		_, err := ns.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: r.target(node, id)})
		return err
	})
	r.call(t, "NodeUnstageVolume "+id+" on "+node, func(ctx context.Context) error {
		_, err := ns.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: r.staging(node, id)})
		return err
	})
}

// unpublish is the reverse of publish, in the kubelet's order: NodeUnpublish,
// NodeUnstage, then ControllerUnpublish.
func (r *run) unpublish(t *testing.T, id string) {
	t.Helper()
	node, ok := r.published[id]
	if !ok {
		return
	}
	r.unstage(t, id)
	r.call(t, "ControllerUnpublishVolume "+id+" from "+node, func(ctx context.Context) error {
		_, err := r.b.Controller().ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: node})
		return err
	})
	delete(r.published, id)
}

// dataFile is the file the scenarios write in a published volume.
func (r *run) dataFile(id string) string { return path.Join(r.target(r.published[id], id), "data") }

// checksum is sha256sum's reading of the volume's data file where it is published.
func (r *run) checksum(t *testing.T, id string) string {
	t.Helper()
	out, err := r.b.Shell(r.ctx, r.published[id], "sha256sum "+r.dataFile(id))
	if err != nil {
		t.Fatalf("sha256sum on %s: %v", r.published[id], err)
	}
	sum, _, _ := strings.Cut(strings.TrimSpace(out), " ")
	return sum
}

// diskful returns the volume's Diskful members' nodes, sorted.
func (r *run) diskful(t *testing.T, id string) []string {
	t.Helper()
	var out []string
	for _, m := range r.rv(t, id).Status.Datamesh.Members {
		if m.Type == v1.MemberTypeDiskful {
			out = append(out, m.NodeName)
		}
	}
	slices.Sort(out)
	return out
}

// dataBytes is how much the scenarios write: 4 MiB of random data.
const dataBytes = 4 << 20

// Scenario 2: publish the default class's volume on its first Diskful node,
// stage it (mkfs.ext4 on the DRBD device), write a file with fsync and
// record its checksum.
func (r *run) publishWrite(t *testing.T) {
	id := r.vols["2d-1tb"]
	node := r.diskful(t, id)[0]
	r.publish(t, id, node)
	r.step(t, "2 published on the first Diskful node")
	script := fmt.Sprintf("dd if=/dev/urandom of=%s bs=1M count=%d conv=fsync 2>&1 && sync", r.dataFile(id), dataBytes>>20)
	if out, err := r.b.Shell(r.ctx, node, script); err != nil {
		t.Fatalf("writing on %s: %v: %s", node, err, out)
	}
	r.sums[id] = r.checksum(t, id)
	r.rec.Figures = append(r.rec.Figures, fmt.Sprintf("2: wrote %d bytes with fsync on %s", dataBytes, node))
	r.step(t, "2 written")
}

// Scenario 3: unpublish, unstage, detach; publish on the other Diskful node;
// the checksum matches.
func (r *run) move(t *testing.T) {
	id := r.vols["2d-1tb"]
	from := r.published[id]
	if from == "" {
		t.Fatal("scenario 2 did not publish the volume")
	}
	r.unpublish(t, id)
	r.step(t, "3 unpublished")
	var to string
	for _, n := range r.diskful(t, id) {
		if n != from {
			to = n
		}
	}
	r.publish(t, id, to)
	if got := r.checksum(t, id); got != r.sums[id] {
		t.Fatalf("the file written on %s reads back on %s with sha256 %s, want %s", from, to, got, r.sums[id])
	}
	r.rec.Figures = append(r.rec.Figures, fmt.Sprintf("3: %d bytes written on %s read back on %s", dataBytes, from, to))
	r.step(t, "3 published on the other Diskful node")
}

// Scenario 9: unpublish and DeleteVolume every volume; nothing is left in
// any node (no DRBD resource, no configuration, no backing volume) nor in
// the apiserver (no RV, RVR, RVA or Secret).
func (r *run) delete(t *testing.T) {
	if r.o.Inspect != nil {
		r.o.Inspect(t, r.volumes())
	}
	for _, id := range r.volumes() {
		r.unpublish(t, id)
	}
	for _, id := range r.volumes() {
		r.call(t, "DeleteVolume "+id, func(ctx context.Context) error {
			_, err := r.b.Controller().DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id})
			return err
		})
	}
	for _, id := range r.volumes() {
		r.eventually(t, id+" gone", func() string { return r.leftovers(id) })
	}
	r.step(t, "9 deleted")
}

// leftovers says what is left of volume id anywhere, "" when nothing.
func (r *run) leftovers(id string) string {
	cl := r.b.Client()
	var left []string
	if err := cl.Get(r.ctx, client.ObjectKey{Name: id}, &v1.ReplicatedVolume{}); !apierrors.IsNotFound(err) {
		left = append(left, fmt.Sprintf("RV (%v)", err))
	}
	var rvrs v1.ReplicatedVolumeReplicaList
	var rvas v1.ReplicatedVolumeAttachmentList
	if err := errors.Join(cl.List(r.ctx, &rvrs, client.MatchingLabels{v1.LabelVolume: id}),
		cl.List(r.ctx, &rvas, client.MatchingLabels{v1.LabelVolume: id})); err != nil {
		return err.Error()
	}
	if len(rvrs.Items) > 0 || len(rvas.Items) > 0 {
		left = append(left, fmt.Sprintf("%d RVRs, %d RVAs", len(rvrs.Items), len(rvas.Items)))
	}
	if s := r.secrets[id]; s != "" {
		if err := cl.Get(r.ctx, client.ObjectKey{Namespace: r.b.Namespace(), Name: s}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			left = append(left, "Secret "+s)
		}
	}
	for _, node := range r.b.Nodes() {
		if r.down[node] {
			continue // a crashed node keeps what it had; its RVRs must still go
		}
		if st, err := r.b.DRBD(node).Status(r.ctx, id); err == nil && len(st) > 0 {
			left = append(left, "DRBD resource on "+node)
		}
		more, err := r.b.Leftovers(r.ctx, node, id)
		if err != nil {
			left = append(left, fmt.Sprintf("%s: %v", node, err))
		}
		for _, m := range more {
			left = append(left, node+": "+m)
		}
	}
	return strings.Join(left, "; ")
}

// mounted returns the size in bytes of the file system mounted at the
// volume's target path where it is published.
func (r *run) mounted(t *testing.T, id string) int64 {
	t.Helper()
	node := r.published[id]
	out, err := r.b.Shell(r.ctx, node, "df -B1 --output=size "+r.target(node, id)+" | tail -1")
	if err != nil {
		t.Fatalf("df on %s: %v", node, err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatalf("df on %s: %q: %v", node, out, err)
	}
	return n
}

// expandedSize is what scenario 4 grows the volume to.
const expandedSize = 96 << 20

// Scenario 4: online expansion of the published volume — ControllerExpand
// (external-resizer), then NodeExpand (kubelet) while the file system is
// mounted; the size seen on the node grows.
func (r *run) expand(t *testing.T) {
	id := r.vols["2d-1tb"]
	node := r.published[id]
	before := r.mounted(t, id)
	var resp *csipb.ControllerExpandVolumeResponse
	r.call(t, "ControllerExpandVolume "+id, func(ctx context.Context) (err error) {
		resp, err = r.b.Controller().ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: id,
			CapacityRange: &csipb.CapacityRange{RequiredBytes: expandedSize}, VolumeCapability: mountCap})
		return err
	})
	if !resp.GetNodeExpansionRequired() {
		t.Fatalf("ControllerExpandVolume of a mounted volume says no node expansion is needed")
	}
	how := "online"
	r.call(t, "NodeExpandVolume "+id+" on "+node, func(ctx context.Context) error {
		_, err := r.b.NodeService(node).NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: id,
			VolumePath: r.target(node, id), StagingTargetPath: r.staging(node, id),
			CapacityRange: &csipb.CapacityRange{RequiredBytes: expandedSize}, VolumeCapability: mountCap})
		if status.Code(err) == codes.FailedPrecondition && strings.Contains(err.Error(), "CAP_SYS_RESOURCE") {
			// A node service without CAP_SYS_RESOURCE (the test
			// machine's root may lack it) cannot grow a mounted ext4;
			// it says so, and the file system grows at the next
			// stage (docs/controller.md, "The file system grows in
			// NodeExpandVolume"). Restart the "pod" as the message asks.
			how = "at the next stage (no CAP_SYS_RESOURCE for online growth)"
			return nil
		}
		return err
	})
	if how != "online" {
		r.unstage(t, id)
		r.stage(t, id)
	}
	after := r.mounted(t, id)
	if after <= before {
		t.Fatalf("the file system on %s is %d bytes after the expansion, %d before", node, after, before)
	}
	if got := r.checksum(t, id); got != r.sums[id] {
		t.Fatalf("after the expansion the file reads with sha256 %s, want %s", got, r.sums[id])
	}
	r.rec.Figures = append(r.rec.Figures, fmt.Sprintf("4: file system on %s grew %s from %d to %d bytes", node, how, before, after))
	r.step(t, "4 expanded")
}

// writer writes files of 256 KiB with fsync in the volume where it is
// published, one after another, in the background on the node, until it is
// stopped; the first failing write ends it. The stop function returns how
// many writes it made, or what failed.
func (r *run) writer(t *testing.T, id string) (stop func() (int, error)) {
	t.Helper()
	node := r.published[id]
	dir := path.Join(r.target(node, id), "writer")
	loop := fmt.Sprintf(`i=0; while [ ! -e %[1]s/stop ]; do dd if=/dev/urandom of=%[1]s/f$((i %% 16)) bs=64k count=4 conv=fsync 2>/dev/null || { echo "failed: write $i"; exit 1; }; i=$((i+1)); done; echo "done $i"`, dir)
	script := fmt.Sprintf(`mkdir -p %[1]s && rm -f %[1]s/stop %[1]s/log && (sh -c '%[2]s' >%[1]s/log 2>&1 </dev/null &)`, dir, loop)
	if out, err := r.b.Shell(r.ctx, node, script); err != nil {
		t.Fatalf("starting the writer on %s: %v: %s", node, err, out)
	}
	// A scenario that fails before stopping its writer must not leave it
	// holding the file system: the volume could not be unmounted.
	t.Cleanup(func() { _, _ = r.b.Shell(r.ctx, node, "touch "+dir+"/stop; sleep 2") })
	return func() (int, error) {
		if _, err := r.b.Shell(r.ctx, node, "touch "+dir+"/stop"); err != nil {
			return 0, err
		}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			out, err := r.b.Shell(r.ctx, node, "cat "+dir+"/log")
			out = strings.TrimSpace(out)
			switch {
			case err != nil:
				return 0, err
			case strings.HasPrefix(out, "done "):
				return strconv.Atoi(strings.TrimPrefix(out, "done "))
			case out != "":
				return 0, errors.New(out)
			case time.Now().After(deadline):
				return 0, errors.New("the writer did not stop within 2 minutes")
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// role is DRBD's role of the volume on node ("" when it does not run).
func (r *run) role(id, node string) string {
	ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
	defer cancel()
	st, err := r.b.DRBD(node).Status(ctx, id)
	if err != nil || len(st) != 1 {
		return ""
	}
	return st[0].Role
}

// Scenario 7: `meshvol node` killed and started again on the node where a
// writer runs; no write fails, DRBD stays Primary throughout, and the new
// agent adopts what the kernel runs (the replica Ready again at the same
// revision).
func (r *run) agentRestart(t *testing.T) {
	id := r.vols["2d-1tb"]
	node := r.published[id]
	rev := r.rv(t, id).Status.DatameshRevision
	stop := r.writer(t, id)
	time.Sleep(3 * time.Second)
	if err := r.b.RestartAgent(r.ctx, node); err != nil {
		t.Fatalf("restarting the agent on %s: %v", node, err)
	}
	var roles []string
	for i := 0; i < 30; i++ {
		roles = append(roles, r.role(id, node))
		time.Sleep(500 * time.Millisecond)
	}
	n, err := stop()
	if err != nil {
		t.Fatalf("the writer on %s across the agent's restart: %v", node, err)
	}
	for _, role := range roles {
		if role != "Primary" {
			t.Fatalf("DRBD on %s while its agent restarted: roles %v, want Primary throughout", node, roles)
		}
	}
	r.eventually(t, "the restarted agent reports "+id+" Ready", func() string {
		for _, x := range r.rvrsOf(t, id) {
			if x.Spec.NodeName == node && (x.Status.DatameshRevision != rev || x.Status.Role != v1.RolePrimary) {
				return rvrSummary(&x)
			}
		}
		if cur := r.rv(t, id); cur.Status.Phase != v1.VolumePhaseReady || cur.Status.DatameshRevision != rev {
			return fmt.Sprintf("volume phase %s revision %d, was %d", cur.Status.Phase, cur.Status.DatameshRevision, rev)
		}
		return ""
	})
	r.rec.Figures = append(r.rec.Figures, fmt.Sprintf("7: %d writes of 256 KiB with fsync on %s across the agent's restart, none failed", n, node))
	r.step(t, "7 agent restarted")
}

func (r *run) rvrsOf(t *testing.T, id string) []v1.ReplicatedVolumeReplica {
	t.Helper()
	var list v1.ReplicatedVolumeReplicaList
	if err := r.b.Client().List(r.ctx, &list, client.MatchingLabels{v1.LabelVolume: id}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// Scenario 5: the node holding the Primary of the 2d-1tb and 3d volumes
// (scenario 8, or 6, left both published there, with data written) crashes; as Kubernetes does for a lost node, each attachment is released
// (ControllerUnpublish) and the volume published on a survivor, where every
// fsynced byte reads back. The figures: time from the crash to published
// elsewhere, bytes checked.
func (r *run) crash(t *testing.T) {
	two, three := r.vols["2d-1tb"], r.vols["3d"]
	node := r.published[two]
	if r.published[three] != node {
		t.Fatalf("%s is published on %q, not on %s with %s", three, r.published[three], node, two)
	}
	crashed := time.Now()
	if err := r.b.Crash(r.ctx, node); err != nil {
		t.Fatal(err)
	}
	r.down[node] = true
	for _, id := range []string{three, two} {
		r.call(t, "ControllerUnpublishVolume "+id+" from the crashed "+node, func(ctx context.Context) error {
			_, err := r.b.Controller().ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: node})
			return err
		})
		delete(r.published, id)
		var to string
		for _, n := range r.diskful(t, id) {
			if !r.down[n] && to == "" {
				to = n
			}
		}
		r.publish(t, id, to)
		took := time.Since(crashed)
		if got := r.checksum(t, id); got != r.sums[id] {
			t.Fatalf("%s: the file fsynced on %s reads back on %s with sha256 %s, want %s", id, node, to, got, r.sums[id])
		}
		r.rec.Figures = append(r.rec.Figures, fmt.Sprintf("5: %s: crash of %s -> published on %s in %s; %d fsynced bytes read back",
			id, node, to, took.Round(100*time.Millisecond), dataBytes))
	}
	r.step(t, "5 published on survivors")
}

// layoutAs waits until the volume is Ready with exactly l's members.
func (r *run) layoutAs(t *testing.T, id string, l Layout) {
	t.Helper()
	r.eventually(t, id+" Ready as "+l.Name, func() string {
		rv := r.rv(t, id)
		count := map[v1.MemberType]int{}
		for _, m := range rv.Status.Datamesh.Members {
			count[m.Type]++
		}
		if rv.Status.Phase != v1.VolumePhaseReady || len(rv.Status.DatameshTransitions) > 0 ||
			count[v1.MemberTypeDiskful] != l.Diskful || count[v1.MemberTypeTieBreaker] != l.TieBreakers {
			cfg := "none"
			if c := rv.Status.Configuration; c != nil {
				cfg = fmt.Sprintf("ftt %d gmdr %d", c.FailuresToTolerate, c.GuaranteedMinimumDataRedundancy)
			}
			var conds []string
			for _, c := range rv.Status.Conditions {
				if c.Status != metav1.ConditionTrue {
					conds = append(conds, c.Type+": "+c.Message)
				}
			}
			return fmt.Sprintf("phase %s, configuration %s, %d transitions, members %v, %v", rv.Status.Phase, cfg, len(rv.Status.DatameshTransitions), count, conds)
		}
		return ""
	})
}

// setClass changes the protection of the run's class name (Options.Prefix).
func (r *run) setClass(t *testing.T, name string, l Layout) {
	t.Helper()
	name = r.class(name)
	for {
		rsc := &v1.ReplicatedStorageClass{}
		if err := r.b.Client().Get(r.ctx, client.ObjectKey{Name: name}, rsc); err != nil {
			t.Fatal(err)
		}
		ftt, gmdr := l.FTT, l.GMDR
		rsc.Spec.FailuresToTolerate, rsc.Spec.GuaranteedMinimumDataRedundancy = &ftt, &gmdr
		err := r.b.Client().Update(r.ctx, rsc)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
}

// twoD is the layout scenario 8 steps down to. Not 2D+1TB: on three nodes the
// controller places 3D → 2D+1TB as a new TieBreaker beside the three Diskful
// replicas instead of retyping one of them, finds no fourth node, and the
// change never completes (Scheduled=False "No node fits"; test/vm/FINDINGS.md).
var twoD = Layout{Name: "2d", FTT: 0, GMDR: 1, Diskful: 2}

// Scenario 8: the 3d volume, published where the 2d-1tb one is, changes
// protection 3D → 2D → 3D by changing its class, with a writer running; no
// write fails and the data written before reads back.
func (r *run) protectionChange(t *testing.T) {
	two, three := r.vols["2d-1tb"], r.vols["3d"]
	node := r.published[two]
	r.publish(t, three, node)
	script := fmt.Sprintf("dd if=/dev/urandom of=%s bs=1M count=%d conv=fsync 2>&1 && sync", r.dataFile(three), dataBytes>>20)
	if out, err := r.b.Shell(r.ctx, node, script); err != nil {
		t.Fatalf("writing on %s: %v: %s", node, err, out)
	}
	r.sums[three] = r.checksum(t, three)
	r.step(t, "8 3d published and written")
	stop := r.writer(t, three)
	var report []string
	for _, l := range []Layout{twoD, Layouts[2]} {
		began := time.Now()
		r.setClass(t, "3d", l)
		r.layoutAs(t, three, l)
		report = append(report, fmt.Sprintf("to %s in %s", l.Name, time.Since(began).Round(100*time.Millisecond)))
		r.step(t, "8 class 3d as "+l.Name)
	}
	n, err := stop()
	if err != nil {
		t.Fatalf("the writer on %s across the protection changes: %v", node, err)
	}
	if got := r.checksum(t, three); got != r.sums[three] {
		t.Fatalf("after the protection changes the file reads with sha256 %s, want %s", got, r.sums[three])
	}
	r.rec.Figures = append(r.rec.Figures, fmt.Sprintf("8: 3D -> 2D -> 3D on %s (%s) with %d writes of 256 KiB with fsync, none failed",
		node, strings.Join(report, ", "), n))
}
