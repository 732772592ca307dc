package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/finalizer"
	"github.com/meshvol/meshvol/pkg/sharedsecret"
	"github.com/meshvol/meshvol/pkg/storage"
)

// step is the outcome of one reconcile of one replica: the status to report
// and when to look again (0: only when something changes).
type step struct {
	st    v1.ReplicatedVolumeReplicaStatus
	retry time.Duration
	// gone: the finalizer was released; there is nothing left to report.
	gone bool
	// acted: this reconcile changed the kernel's state, so the report is
	// read from the kernel now rather than from the Observer, which may not
	// have seen the change yet (a confirmed Detach must not show Primary).
	acted bool
	// waiting: the replica waits to join the datamesh and holds nothing on
	// this node: a report would say only that.
	waiting bool
}

func (a *Agent) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	a.changes.Add(1)
	rvr := &v1.ReplicatedVolumeReplica{}
	if err := a.cache.Get(ctx, req.NamespacedName, rvr); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone: whatever it ran here is no replica's now (runGC), unless this
			// agent took it down and released it (released).
			if a.goneReplica(req.Name, time.Now()) {
				a.requestCollect()
			}
			a.unconfirmed.forget(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if a.releasedHere(rvr) {
		return ctrl.Result{}, nil // torn down and its finalizer released: its deletion event comes next
	}
	if rvr.Spec.NodeName != a.cfg.NodeName {
		return ctrl.Result{}, nil // labelled for this node but placed elsewhere: not ours
	}
	if !a.obs.Synced() {
		// Adopting what the kernel runs needs the kernel's picture first.
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	var rv *v1.ReplicatedVolume
	if rvr.Spec.ReplicatedVolumeName != "" {
		rv = &v1.ReplicatedVolume{}
		if err := a.cache.Get(ctx, types.NamespacedName{Name: rvr.Spec.ReplicatedVolumeName}, rv); err != nil {
			if !apierrors.IsNotFound(err) {
				return ctrl.Result{}, err
			}
			rv = nil
		}
	}
	s := a.converge(ctx, rvr, rv)
	a.sayUnconfirmed(rvr, rv, &s)
	if s.gone || s.waiting && neverReported(rvr) {
		// A new replica waiting for its first revision has nothing to report
		// the controller needs: it takes the node's addresses from the Lease
		// (docs/contract.md). Its first report is the configuration it runs —
		// a write per replica of every volume formed, saved.
		return ctrl.Result{}, nil
	}
	pace := reportPacing{dayZero: awaitsDayZero(rv, &s.st), goingAway: goingAway(rv)}
	if !pace.goingAway && peerLeft(rv, rvr.Status, s.st) {
		switch fresh := a.volumeFromAPIServer(ctx, rv); {
		case volumeGoes(fresh):
			// The peer left because its agent saw the volume go before this
			// agent's cache did: the mark's event wakes this replica to leave
			// too (volumeUpdateWakesReplicas), and the report goes unwritten.
			return ctrl.Result{RequeueAfter: a.cfg.ProgressInterval}, nil
		case goingAway(fresh):
			pace.goingAway = true
		}
	}
	after, err := a.writeStatus(ctx, rvr, s.st, pace)
	if err != nil {
		return ctrl.Result{}, err
	}
	res := ctrl.Result{RequeueAfter: s.retry}
	if after > 0 && (res.RequeueAfter == 0 || after < res.RequeueAfter) {
		res.RequeueAfter = after
	}
	return res, nil
}

// sayUnconfirmed logs why a member leaves its volume's revision unconfirmed,
// once per distinct reason: a revision waits on it (an Attach waits for its
// promotion), the step is retried every RetryInterval with the same reason,
// and the conditions that hold it vanish with the replica, so the log is
// where an Attach that never completed is explained.
func (a *Agent) sayUnconfirmed(rvr *v1.ReplicatedVolumeReplica, rv *v1.ReplicatedVolume, s *step) {
	why := ""
	if !s.gone && memberOf(rv, rvr.Name) != nil && s.st.DatameshRevision < rv.Status.DatameshRevision {
		var parts []string
		for _, c := range s.st.Conditions {
			if c.Status != metav1.ConditionTrue && slices.Contains(ownedConditions, c.Type) {
				parts = append(parts, c.Type+"="+string(c.Status)+" "+c.Reason+": "+c.Message)
			}
		}
		why = strings.Join(parts, "; ")
	}
	if a.unconfirmed.changed(rvr, why) {
		a.log.Info("datamesh revision not confirmed yet; will retry", "replica", rvr.Name,
			"revision", rv.Status.DatameshRevision, "confirmed", s.st.DatameshRevision, "why", why)
	}
}

// converge moves this node's DRBD one step toward the datamesh and says what
// to report. A replica that is not a member leaves (leave); a member's step
// follows docs/contract.md's "What a confirmed revision means": its backing
// volume, the configuration its revision renders, that configuration applied
// and read back from the kernel, then the device's size and the DRBD role —
// and only then the revision confirmed.
func (a *Agent) converge(ctx context.Context, rvr *v1.ReplicatedVolumeReplica, rv *v1.ReplicatedVolume) step {
	r := &replicaStep{a: a, rvr: rvr, rv: rv, now: metav1.Now().Rfc3339Copy()}
	r.st = v1.ReplicatedVolumeReplicaStatus{ObservedGeneration: rvr.Generation, Addresses: a.addressStrings()}
	member := memberOf(rv, rvr.Name)
	if member == nil || volumeGoes(rv) {
		return a.leave(ctx, r)
	}
	if a.userSuspended(rv.Name) {
		// suspend-io is only ever meshvol's, for a snapshot; none holds it now (a
		// crash between suspend and resume, or a snapshot deleted meanwhile).
		if err := a.resumeUnlessHeld(ctx, rv.Name); err != nil {
			return r.failed(ctx, "resume-io", err)
		}
	}
	// An earlier replica's resource goes before this one's backing volume is
	// made: on a full pool the new volume may only fit once the old one is gone.
	got, err := a.shown(ctx, rv.Name)
	if err != nil {
		return r.failed(ctx, "read back (drbdsetup show)", err)
	}
	if got, err = a.evictEarlierIncarnation(ctx, r, member, got); err != nil {
		s := r.failed(ctx, "taking down an earlier replica's resource", err)
		s.retry = retryAfter(err, s.retry)
		return s
	}
	vol, err := a.backing(ctx, r, member)
	if err != nil {
		return r.failed(ctx, "backing volume", err)
	}
	want, what, err := a.desiredConfig(ctx, r, member, vol)
	if err != nil {
		return r.failed(ctx, what, err)
	}
	if done, s := a.applyConfig(ctx, r, want, got); done {
		return s
	}
	if err := a.freeBacking(ctx, r.rvr, member); err != nil {
		return r.failed(ctx, "freeing the backing volume of a replica retyped to "+string(r.rvr.Spec.Type), err)
	}
	s := a.confirm(ctx, r, member, vol)
	for _, wait := range []time.Duration{a.reconnectStandAlone(ctx, want), a.recomputeStaleQuorum(ctx, want, member.Attached)} {
		if wait > 0 && (s.retry <= 0 || wait < s.retry) {
			s.retry = wait
		}
	}
	return s
}

// reconnectStandAlone tries again, with adjust, the connections to configured peers
// that DRBD left StandAlone, at most once per StandAloneRetryInterval; it returns
// when to look again (0: none is StandAlone). DRBD does not retry such a connection
// by itself (a connect refused, an authentication that failed, a split brain:
// docs/drbd-quorum.md), and the kernel runs the configuration the datamesh asks for,
// so nothing else would ever run adjust: a connection refused while a stale Primary
// held its IO stayed down after that node was demoted, and one whose peer changed its
// secret before this node did stayed down after both had. Trying again is safe:
// DRBD's handshake decides again — a stale Primary is refused again, a split brain
// (no after-sb policy is configured, so "disconnect") is detected again and stays
// StandAlone, never resolved by discarding data.
func (a *Agent) reconnectStandAlone(ctx context.Context, want *drbd.Resource) time.Duration {
	snap, ok := a.obs.Snapshot(want.Name)
	if !ok {
		return 0
	}
	var peers []string
	for _, c := range snap.Connections {
		if c.State != "StandAlone" {
			continue
		}
		for _, p := range want.Peers {
			if p.NodeID == c.PeerNodeID {
				peers = append(peers, c.Name)
			}
		}
	}
	if len(peers) == 0 {
		a.mu.Lock()
		delete(a.standAloneTried, want.Name)
		a.mu.Unlock()
		return 0
	}
	every := a.cfg.StandAloneRetryInterval
	now := time.Now()
	a.mu.Lock()
	last, tried := a.standAloneTried[want.Name]
	due := !tried || now.Sub(last) >= every
	if due {
		a.standAloneTried[want.Name] = now
	}
	a.mu.Unlock()
	if !due {
		return every - now.Sub(last)
	}
	slices.Sort(peers)
	a.log.Info("connecting StandAlone peers again (adjust)", "resource", want.Name, "peers", peers)
	if err := a.drv.Adjust(ctx, want.Name); err != nil {
		a.log.Info("adjust for StandAlone peers failed; will retry", "resource", want.Name, "err", drbd.RedactSecrets(err.Error()))
	}
	return every
}

// evictEarlierIncarnation takes the volume's resource down when the kernel runs
// it for an earlier replica of this name (earlierIncarnation), so that this
// replica starts from its own backing volume and fresh DRBD state. It is taken
// down as any resource is, never forced: while that replica's device is held open
// (its pod's mount, until the kubelet ends the pod) the step fails and retries.
// It returns what the kernel runs afterwards: got, or nil once it is down.
func (a *Agent) evictEarlierIncarnation(ctx context.Context, r *replicaStep, member *v1.DatameshMember, got *drbd.ShowResource) (*drbd.ShowResource, error) {
	why, err := a.earlierIncarnation(ctx, r.rvr, member, got)
	if err != nil || why == "" {
		return got, err
	}
	// A take-down refused a moment ago is not tried (nor said) again at every
	// wake-up meanwhile (takeDownGate); its refusal is reported as it was.
	err = a.downs.wait(r.rv.Name)
	if err == nil {
		a.log.Info("the kernel runs an earlier replica of this name; taking its resource down", "replica", r.rvr.Name, "why", why)
		r.acted = true
		err = a.takeDown(ctx, r.rv.Name)
	}
	if err != nil {
		if errors.Is(err, drbd.ErrDeviceInUse) {
			r.cond(v1.ConditionDRBDRole, metav1.ConditionFalse, v1.ReasonDemoteRefused,
				"An earlier replica of this name still runs here ("+why+") and its device is held open; will retry, never forced: "+drbd.RedactSecrets(err.Error()))
		}
		return got, fmt.Errorf("%s: %w", why, err)
	}
	return nil, nil
}

// freeBacking deletes the backing volume of a replica retyped from Diskful to
// Access or TieBreaker once its member is diskless too and the kernel runs the
// member's configuration (the caller saw to it), so DRBD no longer uses the
// disk. The replica keeps its spec.storage through the retype
// (docs/controller.md, "Retyping a replica"), which says where the volume is.
// Retyped back to Diskful, the replica gets a fresh volume and resyncs into it.
func (a *Agent) freeBacking(ctx context.Context, rvr *v1.ReplicatedVolumeReplica, member *v1.DatameshMember) error {
	diskless := rvr.Spec.Type == v1.ReplicaTypeAccess || rvr.Spec.Type == v1.ReplicaTypeTieBreaker
	if !diskless || member.Type.ConnectsToAllPeers() || rvr.Spec.Storage == nil {
		return nil
	}
	a.mu.Lock()
	freed := a.freed[rvr.UID]
	a.mu.Unlock()
	if freed {
		return nil
	}
	if err := a.deleteBacking(ctx, rvr); err != nil {
		return err
	}
	a.mu.Lock()
	delete(a.volumes, rvr.UID)
	a.freed[rvr.UID] = true
	a.mu.Unlock()
	a.log.Info("replica retyped to a diskless type; backing volume freed", "replica", rvr.Name, "type", rvr.Spec.Type)
	return nil
}

// replicaStep is one converge of one replica in progress: the step it will
// return and what it needs to set conditions and report failures.
type replicaStep struct {
	step
	a   *Agent
	rvr *v1.ReplicatedVolumeReplica
	rv  *v1.ReplicatedVolume
	now metav1.Time
}

// cond sets a condition of the report, keeping its transition time while its
// status stays what the replica last reported.
func (r *replicaStep) cond(typ string, status metav1.ConditionStatus, reason, msg string) {
	r.st.Conditions = setCondition(r.st.Conditions, r.rvr.Status.Conditions,
		metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg}, r.rvr.Generation, r.now)
}

// failed ends the step on an error of what: DRBDConfigured=False naming it,
// the revision last confirmed, a retry, and the kernel's state.
func (r *replicaStep) failed(ctx context.Context, what string, err error) step {
	r.a.log.Info("replica step failed; will retry", "replica", r.rvr.Name, "step", what, "err", drbd.RedactSecrets(err.Error()))
	r.cond(v1.ConditionDRBDConfigured, metav1.ConditionFalse, v1.ReasonConfigurationFailed, what+": "+drbd.RedactSecrets(err.Error()))
	return r.notConfirmed(ctx)
}

// notConfirmed ends the step without confirming the revision: the one last
// confirmed, a retry, and the kernel's state.
func (r *replicaStep) notConfirmed(ctx context.Context) step {
	r.st.DatameshRevision = r.rvr.Status.DatameshRevision
	r.retry = r.a.cfg.RetryInterval
	r.a.fillKernel(ctx, &r.st, r.rv, r.rvr, r.acted)
	return r.step
}

// memberOf is the datamesh's member named name, nil when there is none.
func memberOf(rv *v1.ReplicatedVolume, name string) *v1.DatameshMember {
	if rv == nil {
		return nil
	}
	for i := range rv.Status.Datamesh.Members {
		if m := &rv.Status.Datamesh.Members[i]; m.Name == name {
			return m
		}
	}
	return nil
}

// leave converges a replica that is not (or no longer) a member, or one of a volume
// that goes (volumeGoes): nothing of its volume may run here. A deleted one, and one of
// a volume that goes, deleted or not yet, is released (backing volume, finalizer): the
// controller deletes the replicas of a volume that goes once their agents released
// them (docs/contract.md, "Deleting a volume"). One waiting to join says so.
func (a *Agent) leave(ctx context.Context, r *replicaStep) step {
	resName := r.rvr.Spec.ReplicatedVolumeName
	if _, running := a.obs.Snapshot(resName); running {
		if err := a.takeDown(ctx, resName); err != nil {
			if errors.Is(err, drbd.ErrDeviceInUse) {
				r.cond(v1.ConditionDRBDRole, metav1.ConditionFalse, v1.ReasonDemoteRefused,
					"Left the datamesh but the device is held open (mounted?); will retry, never forced: "+drbd.RedactSecrets(err.Error()))
			}
			s := r.failed(ctx, "taking down the resource of a replica that is not a datamesh member", err)
			s.retry = retryAfter(err, s.retry)
			return s
		}
	}
	if r.rvr.DeletionTimestamp != nil || volumeGoes(r.rv) {
		if err := a.releaseReplica(ctx, r.rvr); err != nil {
			return r.failed(ctx, "tearing down the deleted replica", err)
		}
		r.gone = true
		return r.step
	}
	msg := fmt.Sprintf("Volume %q not found", resName)
	if r.rv != nil {
		msg = fmt.Sprintf("Not a member of the datamesh (revision %d)", r.rv.Status.DatameshRevision)
	}
	r.cond(v1.ConditionDRBDConfigured, metav1.ConditionFalse, v1.ReasonPendingDatameshJoin, msg)
	if v, ok := a.knownVolume(r.rvr); ok {
		r.st.BackingVolume = backingStatus(&v)
	}
	r.waiting = r.st.BackingVolume == nil
	return r.step
}

// volumeGoes: the volume is being deleted and shows no member attached and no Attach
// or Detach in flight. Each agent takes its replicas of it down and releases them on
// seeing it, and the controller deletes them once released, without publishing a
// teardown revision first (docs/contract.md, "Deleting a volume"). It holds for good
// once seen: the volume's deletion mark comes with every status published before it,
// and no Attach starts on a volume being deleted (pkg/datamesh attachBlocked), so
// nothing will be attached again. A member deleted while its volume still waits for a
// detach leaves as the engine decides, as any member deleted does.
func volumeGoes(rv *v1.ReplicatedVolume) bool {
	if rv == nil || rv.DeletionTimestamp == nil {
		return false
	}
	for _, m := range rv.Status.Datamesh.Members {
		if m.Attached {
			return false
		}
	}
	for _, t := range rv.Status.DatameshTransitions {
		switch t.Type {
		case v1.TransitionAttach, v1.TransitionDetach, v1.TransitionForceDetach:
			return false
		}
	}
	return true
}

// neverReported: the replica's status holds nothing of the agent's.
func neverReported(rvr *v1.ReplicatedVolumeReplica) bool {
	return sameStatus(rvr.Status, v1.ReplicatedVolumeReplicaStatus{})
}

// backing ensures the member's backing volume: every full-mesh member with
// storage holds one, the liminal ones too (provisioned but not attached to
// DRBD; docs/layouts.md §8.4). nil for a member without one.
func (a *Agent) backing(ctx context.Context, r *replicaStep, member *v1.DatameshMember) (*storage.Volume, error) {
	var vol *storage.Volume
	if member.Type.ConnectsToAllPeers() && r.rvr.Spec.Storage != nil {
		v, err := a.ensureVolume(ctx, r.rvr, r.rv)
		if err != nil {
			return nil, err
		}
		vol = &v
		r.st.BackingVolume = backingStatus(vol)
	}
	return vol, nil
}

// desiredConfig renders what the member's revision asks this node's DRBD to
// run. On an error, what names the step that failed.
func (a *Agent) desiredConfig(ctx context.Context, r *replicaStep, member *v1.DatameshMember, vol *storage.Volume) (want *drbd.Resource, what string, err error) {
	rv := r.rv
	if member.Type.HasDisk() && vol == nil {
		return nil, "render", fmt.Errorf("member is %s but spec.storage is empty", member.Type)
	}
	secret := ""
	if ref := rv.Status.Datamesh.SharedSecret; ref != nil {
		if secret, err = a.sharedSecret(ctx, rv, ref); err != nil {
			return nil, "shared secret", err
		}
	}
	var rsc *v1.ReplicatedStorageClass
	if name := rv.Spec.ReplicatedStorageClassName; name != "" {
		rsc = &v1.ReplicatedStorageClass{}
		if err := a.cache.Get(ctx, types.NamespacedName{Name: name}, rsc); err != nil {
			rsc = nil
		}
	}
	in := renderInput{rv: rv, self: member, rvr: r.rvr, rsc: rsc, secret: secret, features: a.cfg.Features}
	if member.Type.HasDisk() {
		in.backing = vol.DevicePath
	}
	want, err = render(in)
	return want, "render", err
}

// applyConfig brings the kernel to want when it runs something else, and
// reads it back. done: the step ends here (a failure, or the kernel still
// runs something else), with s to report.
func (a *Agent) applyConfig(ctx context.Context, r *replicaStep, want *drbd.Resource, got *drbd.ShowResource) (done bool, s step) {
	rev := r.rv.Status.DatameshRevision
	diff := configDiff(want, got)
	var err error
	if len(diff) > 0 {
		a.log.Info("applying datamesh revision", "replica", r.rvr.Name, "revision", rev, "differences", strings.Join(diff, "; "))
		r.acted = true
		if err := a.apply(ctx, want); err != nil {
			return true, r.failed(ctx, fmt.Sprintf("applying revision %d", rev), err)
		}
		if diff, err = a.readBack(ctx, want); err != nil {
			return true, r.failed(ctx, "read back (drbdsetup show)", err)
		}
	}
	if len(diff) > 0 {
		r.cond(v1.ConditionDRBDConfigured, metav1.ConditionFalse, v1.ReasonApplyingConfiguration,
			fmt.Sprintf("Revision %d applied but the kernel runs something else: %s", rev, strings.Join(diff, "; ")))
		return true, r.notConfirmed(ctx)
	}
	return false, step{}
}

// confirm finishes a member whose kernel runs its revision's configuration:
// day 0, the device's size, the role; the revision is confirmed only when the
// size and the role are what it asks.
func (a *Agent) confirm(ctx context.Context, r *replicaStep, member *v1.DatameshMember, vol *storage.Volume) step {
	rv, rev := r.rv, r.rv.Status.DatameshRevision
	if a.dayZero(ctx, rv, member) || a.seed(ctx, rv, member) {
		r.acted = true
	}
	resized, err := a.resizeDevice(ctx, rv, member, vol)
	if err != nil {
		return r.failed(ctx, "resize", err)
	}
	// The role is part of what a revision means: a member marked attached
	// confirms only once it is Primary, a detached one only once it is
	// Secondary, so a Detach is confirmed by a real demotion.
	roleOK, retry, changed := a.applyRole(ctx, rv.Name, member, r.cond)
	r.retry = retry
	r.acted = r.acted || changed || resized
	if roleOK && resized {
		r.st.DatameshRevision = rev
		r.cond(v1.ConditionDRBDConfigured, metav1.ConditionTrue, v1.ReasonConfigured, fmt.Sprintf("DRBD runs datamesh revision %d", rev))
	} else {
		r.st.DatameshRevision = r.rvr.Status.DatameshRevision
		msg := fmt.Sprintf("Configuration of revision %d applied; waiting for the DRBD role", rev)
		if !resized {
			msg = fmt.Sprintf("Configuration of revision %d applied; waiting for the DRBD device to grow", rev)
			r.retry = a.cfg.RetryInterval
		}
		r.cond(v1.ConditionDRBDConfigured, metav1.ConditionFalse, v1.ReasonApplyingConfiguration, msg)
	}
	// A newly confirmed revision is what marks an Attach done (RVA Attached) and
	// NodeStage then trusts the role written with it: read that role from the
	// kernel, as applyRole just did, not from an Observer that may lag it.
	confirming := r.st.DatameshRevision != r.rvr.Status.DatameshRevision
	a.fillKernel(ctx, &r.st, rv, r.rvr, r.acted || confirming)
	return r.step
}

// readBack compares what the kernel runs with want.
func (a *Agent) readBack(ctx context.Context, want *drbd.Resource) ([]string, error) {
	got, err := a.shown(ctx, want.Name)
	if err != nil {
		return nil, err
	}
	return configDiff(want, got), nil
}

// shown is the resource's configuration as the kernel runs it, nil when it
// does not run.
func (a *Agent) shown(ctx context.Context, name string) (*drbd.ShowResource, error) {
	shown, err := a.drv.Show(ctx, name)
	if err != nil && !errors.Is(err, drbd.ErrUnknownResource) {
		return nil, err
	}
	for i := range shown {
		if shown[i].Resource == name {
			return &shown[i], nil
		}
	}
	return nil, nil
}

// apply writes the configuration and brings the kernel to it: up for a
// resource that does not run (create-md first when the disk has no
// metadata), adjust otherwise. A resource that runs is never taken down.
func (a *Agent) apply(ctx context.Context, want *drbd.Resource) error {
	if err := a.drv.WriteConfig(ctx, want); err != nil {
		return err
	}
	_, running := a.obs.Snapshot(want.Name)
	if !running {
		// The observer may lag the kernel; ask the kernel itself.
		st, err := a.drv.Status(ctx, want.Name)
		if err != nil && !errors.Is(err, drbd.ErrUnknownResource) {
			return err
		}
		running = len(st) > 0
	}
	attached := false
	if s, ok := a.obs.Snapshot(want.Name); ok {
		if d := s.Devices[drbd.VolumeNumber]; d != nil && !d.Client && d.DiskState != "Diskless" {
			attached = true
		}
	}
	if want.Disk != nil && !attached {
		has, err := a.drv.HasMetadata(ctx, want.Name)
		if err != nil {
			return err
		}
		if !has {
			if err := a.drv.CreateMetadata(ctx, want.Name, v1.DRBDMaxPeers); err != nil {
				return err
			}
		}
	}
	if running {
		return a.drv.Adjust(ctx, want.Name)
	}
	return a.drv.Up(ctx, want.Name)
}

// dayZero skips the initial sync of a brand-new volume: `new-current-uuid
// --clear-bitmap`, only during formation, only on the lowest node-id Diskful
// member, and only when this disk and every other Diskful member's are
// Inconsistent and connected to it — every replica empty and reachable, so
// nothing can be lost by declaring them identical. A replica that joins a
// volume holding data never gets here (no Formation transition) and always
// resyncs.
//
// The event stream says when to look; the kernel's own status decides. The
// stream may lag the kernel (under load, by seconds): right after a clear the
// agent reconciles again, on its own status write, while its events still
// show the disk Inconsistent that the clear made UpToDate, and a second clear
// would be refused by DRBD ("only on a just-created, Inconsistent device") or,
// worse, run on a disk that holds data.
func (a *Agent) dayZero(ctx context.Context, rv *v1.ReplicatedVolume, self *v1.DatameshMember) bool {
	if self.Type != v1.MemberTypeDiskful || !formationActive(rv) || rv.Spec.DataSource != nil {
		return false // a volume with a data source is not empty: restore.go seeds it
	}
	s, ok := a.obs.Snapshot(rv.Name)
	if !ok || !dayZeroObserved(s, rv, self) {
		return false
	}
	st, err := a.drv.Status(ctx, rv.Name)
	if err != nil || len(st) != 1 || !dayZeroInKernel(&st[0], rv, self) {
		return false
	}
	a.log.Info("day 0: every replica is empty and connected; skipping the initial sync", "volume", rv.Name)
	if err := a.drv.NewCurrentUUIDClearBitmap(ctx, rv.Name); err != nil {
		a.log.Error(err, "new-current-uuid --clear-bitmap", "volume", rv.Name)
		return false
	}
	return true
}

// dayZeroObserved: the event stream shows day 0 for self (dayZero).
func dayZeroObserved(s *drbd.ResourceState, rv *v1.ReplicatedVolume, self *v1.DatameshMember) bool {
	d := s.Devices[drbd.VolumeNumber]
	if d == nil || d.DiskState != "Inconsistent" {
		return false
	}
	return everyOtherDiskful(rv, self, func(peer int) bool {
		c := s.Connections[peer]
		if c == nil || c.State != "Connected" {
			return false
		}
		pd := c.PeerDevices[drbd.VolumeNumber]
		return pd != nil && pd.PeerDisk == "Inconsistent"
	})
}

// dayZeroInKernel: `drbdsetup status` shows day 0 for self (dayZero).
func dayZeroInKernel(st *drbd.StatusResource, rv *v1.ReplicatedVolume, self *v1.DatameshMember) bool {
	if len(st.Devices) != 1 || st.Devices[0].DiskState != "Inconsistent" {
		return false
	}
	return everyOtherDiskful(rv, self, func(peer int) bool {
		for _, c := range st.Connections {
			if c.PeerNodeID == peer {
				return c.ConnectionState == "Connected" && len(c.PeerDevices) == 1 && c.PeerDevices[0].PeerDiskState == "Inconsistent"
			}
		}
		return false
	})
}

// everyOtherDiskful: self is the lowest node-id Diskful member and ok holds
// for every other member with a disk.
func everyOtherDiskful(rv *v1.ReplicatedVolume, self *v1.DatameshMember, ok func(peerNodeID int) bool) bool {
	for i := range rv.Status.Datamesh.Members {
		m := &rv.Status.Datamesh.Members[i]
		if m.Name == self.Name || !m.Type.HasDisk() {
			continue
		}
		if m.NodeID < self.NodeID || !ok(int(m.NodeID)) {
			return false // a lower member decides, or this one is not empty and connected
		}
	}
	return true
}

// awaitsDayZero: st is a Diskful member's report in a formation that skips its initial
// sync (dayZero), its disk still Inconsistent. Its peers coming up one by one are
// progress toward the day-0 clear, which makes every disk UpToDate and is reported at
// once: each connection's own report cost a write per peer of every volume formed
// (docs/controller.md, "Write budget"), so they are paced as resync progress is.
func awaitsDayZero(rv *v1.ReplicatedVolume, st *v1.ReplicatedVolumeReplicaStatus) bool {
	return rv != nil && rv.Spec.DataSource == nil && formationActive(rv) && st.DiskState == v1.DiskStateInconsistent
}

// goingAway: rv is being deleted and nothing of it is attached, so its replicas go next
// (docs/controller.md, "Deletion"): once no Attach or Detach is in flight either
// (volumeGoes), each leaves without a report. Until then a report that moves only the
// peers is held back (holdBack): the replica usually leaves before it would matter. A
// revision confirmed is reported at once.
func goingAway(rv *v1.ReplicatedVolume) bool {
	if rv == nil || rv.DeletionTimestamp == nil {
		return false
	}
	for _, m := range rv.Status.Datamesh.Members {
		if m.Attached {
			return false
		}
	}
	return true
}

// peerLeft: st, the report to write, shows a peer not Connected that the replica last
// reported Connected (reported) and that is still a member of rv as cached. A volume
// that goes is taken down by each agent as soon as its cache shows the deletion mark
// (volumeGoes), and the agents' caches see the mark at different moments: the members
// whose agent has not seen it yet see their peers leave first. Their report of the
// departure, a write per member of each volume deleted, would go unread (the volume
// goes); such a departure is the one moment the agent reads the volume from the
// apiserver rather than from its cache (volumeFromAPIServer). A peer's node that
// crashes or is cut off costs the same read, once per member that loses it: a read,
// against the report's write that follows it.
func peerLeft(rv *v1.ReplicatedVolume, reported, st v1.ReplicatedVolumeReplicaStatus) bool {
	for _, p := range reported.Peers {
		if p.ConnectionState != "Connected" || memberOf(rv, p.Name) == nil {
			continue
		}
		i := slices.IndexFunc(st.Peers, func(q v1.PeerStatus) bool { return q.Name == p.Name })
		if i < 0 || st.Peers[i].ConnectionState != "Connected" {
			return true
		}
	}
	return false
}

// volumeFromAPIServer reads rv again from the apiserver, past the agent's cache
// (peerLeft). It returns the cached rv when the read fails: the report is then written
// as it would have been.
func (a *Agent) volumeFromAPIServer(ctx context.Context, rv *v1.ReplicatedVolume) *v1.ReplicatedVolume {
	fresh := &v1.ReplicatedVolume{}
	if err := a.reader.Get(ctx, types.NamespacedName{Name: rv.Name}, fresh); err != nil {
		return rv
	}
	return fresh
}

func formationActive(rv *v1.ReplicatedVolume) bool {
	for _, t := range rv.Status.DatameshTransitions {
		if t.Type == v1.TransitionFormation {
			return true
		}
	}
	return false
}

// applyRole promotes the member the datamesh marks attached and demotes one it
// does not. It reports whether the role is right, and when to retry if not.
func (a *Agent) applyRole(ctx context.Context, name string, m *v1.DatameshMember, cond func(string, metav1.ConditionStatus, string, string)) (ok bool, retry time.Duration, changed bool) {
	role := ""
	if s, ok := a.obs.Snapshot(name); ok {
		role = s.Role
	}
	if st, err := a.drv.Status(ctx, name); err == nil && len(st) == 1 {
		role = st[0].Role // the observer may lag a role change just made
	}
	switch {
	case m.Attached && role != "Primary" && a.snapshotHolds(ctx, name):
		cond(v1.ConditionDRBDRole, metav1.ConditionFalse, v1.ReasonPromoteFailed,
			"Promotion waits: a snapshot of the volume holds its IO suspended (docs/snapshots.md)")
		return false, 100 * time.Millisecond, false
	case m.Attached && role != "Primary":
		if err := a.drv.Primary(ctx, name, drbd.NoForce); err != nil {
			reason := v1.ReasonPromoteFailed
			if errors.Is(err, drbd.ErrNoQuorum) {
				reason = v1.ReasonPromoteNoQuorum // the engine withdraws the Attach on it
			}
			cond(v1.ConditionDRBDRole, metav1.ConditionFalse, reason, "Promotion refused: "+drbd.RedactSecrets(err.Error()))
			return false, a.cfg.RetryInterval, false
		}
		cond(v1.ConditionDRBDRole, metav1.ConditionTrue, v1.ReasonPrimary, "Primary: the datamesh marks this member attached")
		return true, 0, true
	case !m.Attached && role == "Primary":
		if err := a.drv.Secondary(ctx, name); err != nil {
			reason := v1.ReasonDemoteRefused
			msg := "Demotion refused (the device is held open, e.g. mounted); retrying, never forced: "
			if !errors.Is(err, drbd.ErrDeviceInUse) {
				msg = "Demotion failed; retrying: "
			}
			cond(v1.ConditionDRBDRole, metav1.ConditionFalse, reason, msg+drbd.RedactSecrets(err.Error()))
			return false, a.cfg.RetryInterval, false
		}
		cond(v1.ConditionDRBDRole, metav1.ConditionTrue, v1.ReasonSecondary, "Secondary: the datamesh does not mark this member attached")
		return true, 0, true
	case m.Attached:
		cond(v1.ConditionDRBDRole, metav1.ConditionTrue, v1.ReasonPrimary, "Primary: the datamesh marks this member attached")
	default:
		cond(v1.ConditionDRBDRole, metav1.ConditionTrue, v1.ReasonSecondary, "Secondary: the datamesh does not mark this member attached")
	}
	return true, 0, false
}

// resizeDevice grows DRBD after its backing volume grew. It reports whether
// the device is as large as the datamesh asks.
func (a *Agent) resizeDevice(ctx context.Context, rv *v1.ReplicatedVolume, m *v1.DatameshMember, vol *storage.Volume) (bool, error) {
	if !m.Type.HasDisk() || vol == nil {
		return true, nil
	}
	want := rv.DeviceSize()
	s, ok := a.obs.Snapshot(rv.Name)
	if !ok {
		return true, nil
	}
	d := s.Devices[drbd.VolumeNumber]
	if d == nil || d.SizeKiB == 0 || d.SizeKiB*1024 >= want {
		return true, nil
	}
	// The event stream's size can be stale: DRBD 9.2 prints no events2 line
	// when a device grows (test/vm/FINDINGS.md), so a grown device keeps its
	// old size there until its state next changes. Ask the kernel.
	if grown, err := a.kernelSizeAtLeast(ctx, rv.Name, want); err != nil || grown {
		return grown, err
	}
	if err := a.drv.Resize(ctx, rv.Name); err != nil {
		return false, err
	}
	return a.kernelSizeAtLeast(ctx, rv.Name, want)
}

// kernelSizeAtLeast reads the device's size from `drbdsetup status`.
func (a *Agent) kernelSizeAtLeast(ctx context.Context, name string, want int64) (bool, error) {
	st, err := a.drv.Status(ctx, name)
	if err != nil {
		return false, err
	}
	for _, r := range st {
		for _, d := range r.Devices {
			if r.Name == name && d.Volume == drbd.VolumeNumber && d.Size*1024 >= want {
				return true, nil
			}
		}
	}
	return false, nil
}

// ensureVolume creates (or grows) the replica's backing volume, the one under
// its backingKey: never one an earlier replica of the same name left here.
func (a *Agent) ensureVolume(ctx context.Context, rvr *v1.ReplicatedVolumeReplica, rv *v1.ReplicatedVolume) (storage.Volume, error) {
	// Enough for DRBD's internal metadata on top of the volume's size, so that
	// the device offers at least the size (the agent confirms no less).
	need := drbd.BackingBytes(rv.DeviceSize(), v1.DRBDMaxPeers)
	a.mu.Lock()
	v, known := a.volumes[rvr.UID]
	a.mu.Unlock()
	if known && v.SizeBytes >= need {
		return v, nil
	}
	p, err := a.provider(ctx, rvr.Spec.Storage.Pool)
	if err != nil {
		return storage.Volume{}, err
	}
	key := backingKey(rvr)
	v, err = p.Get(ctx, key)
	if err == nil && v.DevicePath == "" {
		// The volume is there but no device is bound to it: after a reboot a file
		// pool's loop devices are gone, and Get does not attach. Create attaches
		// an existing volume (storage.Provider), at its own size.
		v, err = p.Create(ctx, storage.CreateRequest{Replica: key, SizeBytes: v.SizeBytes})
	}
	switch {
	case errors.Is(err, storage.ErrNotFound):
		var src *storage.Source
		if src, err = a.seedSource(ctx, rvr, rv); err != nil {
			return storage.Volume{}, err
		}
		v, err = p.Create(ctx, storage.CreateRequest{Replica: key, SizeBytes: need, Source: src})
		if err == nil {
			a.markCapacity()
		}
	case err == nil && v.SizeBytes < need:
		v, err = p.Resize(ctx, key, need)
	}
	if err != nil {
		return storage.Volume{}, err
	}
	a.mu.Lock()
	a.volumes[rvr.UID] = v
	delete(a.freed, rvr.UID)
	a.mu.Unlock()
	return v, nil
}

// knownVolume is the backing volume this agent last saw for rvr.
func (a *Agent) knownVolume(rvr *v1.ReplicatedVolumeReplica) (storage.Volume, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.volumes[rvr.UID]
	return v, ok
}

// provider returns the pool's provider on this node.
func (a *Agent) provider(ctx context.Context, pool string) (storage.Provider, error) {
	rsp := &v1.ReplicatedStoragePool{}
	if err := a.cache.Get(ctx, types.NamespacedName{Name: pool}, rsp); err != nil {
		return nil, fmt.Errorf("storage pool %q: %w", pool, err)
	}
	return a.providerFor(ctx, rsp)
}

func (a *Agent) providerFor(ctx context.Context, rsp *v1.ReplicatedStoragePool) (storage.Provider, error) {
	a.mu.Lock()
	e, ok := a.pools[rsp.Name]
	a.mu.Unlock()
	if ok && e.generation == rsp.Generation {
		return e.p, nil
	}
	p, err := a.cfg.Pools(ctx, rsp)
	if err != nil {
		return nil, fmt.Errorf("storage pool %q: %w", rsp.Name, err)
	}
	if p == nil {
		return nil, fmt.Errorf("storage pool %q is not served on node %s", rsp.Name, a.cfg.NodeName)
	}
	a.mu.Lock()
	a.pools[rsp.Name] = poolEntry{generation: rsp.Generation, p: p}
	a.mu.Unlock()
	return p, nil
}

// sharedSecret is the volume's DRBD shared secret (docs/contract.md, "The shared
// secret"): read from the volume's own Secret, or derived from the cluster key for the
// volume's UID. Secrets are read by get only, never cached as objects; the value is
// kept in memory because it never changes for the volume.
func (a *Agent) sharedSecret(ctx context.Context, rv *v1.ReplicatedVolume, ref *v1.SharedSecretReference) (string, error) {
	a.mu.Lock()
	known, ok := a.secrets[rv.Name]
	a.mu.Unlock()
	if ok && known.uid == rv.UID && known.secretName == ref.SecretName && known.fingerprint == ref.KeyFingerprint {
		return known.sharedValue, nil
	}
	key := ref.Key
	if key == "" {
		key = v1.SecretKeySharedSecret
	}
	var v string
	switch ref.Derivation {
	case "":
		sec := &corev1.Secret{}
		if err := a.reader.Get(ctx, types.NamespacedName{Namespace: a.cfg.Namespace, Name: ref.SecretName}, sec); err != nil {
			return "", fmt.Errorf("reading Secret %s/%s: %w", a.cfg.Namespace, ref.SecretName, err)
		}
		b := sec.Data[key]
		if len(b) == 0 {
			return "", fmt.Errorf("secret %s/%s has no key %q", a.cfg.Namespace, ref.SecretName, key)
		}
		v = drbdSecret(b)
	case v1.DerivationHMACSHA256:
		k, err := a.drbdKey(ctx, ref.SecretName, key, ref.KeyFingerprint)
		if err != nil {
			return "", err
		}
		v = sharedsecret.Derive(k, rv.UID)
	default:
		return "", fmt.Errorf("status.datamesh.sharedSecret.derivation: %q is none this agent knows (%s): upgrade the agent", ref.Derivation, v1.DerivationHMACSHA256)
	}
	a.mu.Lock()
	a.secrets[rv.Name] = volumeSecret{uid: rv.UID, secretName: ref.SecretName, fingerprint: ref.KeyFingerprint, sharedValue: v}
	a.mu.Unlock()
	return v, nil
}

// drbdKey is the cluster key of the fingerprint a volume names, from the key read
// last when it has that fingerprint, else read again from its Secret: a key
// Secret deleted and created again holds another key, which the fingerprint tells
// apart. A key of another fingerprint is refused, never used: every volume's secret
// would change under its running replicas, which could then no longer connect.
func (a *Agent) drbdKey(ctx context.Context, secretName, dataKey, fingerprint string) ([]byte, error) {
	a.mu.Lock()
	k := a.key
	a.mu.Unlock()
	if k == nil || k.secretName != secretName || k.dataKey != dataKey || k.fingerprint != fingerprint {
		sec := &corev1.Secret{}
		if err := a.reader.Get(ctx, types.NamespacedName{Namespace: a.cfg.Namespace, Name: secretName}, sec); err != nil {
			return nil, fmt.Errorf("reading Secret %s/%s (the cluster key): %w", a.cfg.Namespace, secretName, err)
		}
		b := sec.Data[dataKey]
		if err := sharedsecret.CheckKey("Secret "+a.cfg.Namespace+"/"+secretName+" data."+dataKey, b); err != nil {
			return nil, err
		}
		k = &clusterKey{secretName: secretName, dataKey: dataKey, key: b, fingerprint: sharedsecret.Fingerprint(b)}
		a.mu.Lock()
		a.key = k
		a.mu.Unlock()
	}
	if k.fingerprint != fingerprint {
		return nil, fmt.Errorf("status.datamesh.sharedSecret.keyFingerprint: is %s, but Secret %s/%s holds a key of fingerprint %s: "+
			"a volume's shared secret is derived only from the key it was formed with (restore that key's Secret)",
			fingerprint, a.cfg.Namespace, secretName, k.fingerprint)
	}
	return k.key, nil
}

// drbdSecret is the string DRBD gets: it takes the shared secret as a quoted
// string of at most 63 bytes in the .res file. The controller stores printable
// text (base64url, 43 characters), used as is; anything else (raw bytes, a
// quote, too long) is used in hex form, cut to 63 characters. Every agent
// derives the same string from the same Secret.
func drbdSecret(b []byte) string {
	ok := len(b) > 0 && len(b) <= drbd.MaxSharedSecretLen
	for _, c := range b {
		if c <= ' ' || c > '~' || c == '"' || c == '\\' {
			ok = false
		}
	}
	if ok {
		return string(b)
	}
	v := fmt.Sprintf("%x", b)
	if len(v) > drbd.MaxSharedSecretLen {
		v = v[:drbd.MaxSharedSecretLen]
	}
	return v
}

// releaseReplica finishes a deleted replica that is no longer a member, or one of
// a volume that goes: its DRBD resource is down (the caller saw to it), its
// configuration and backing volume go, then the agent's finalizer.
func (a *Agent) releaseReplica(ctx context.Context, rvr *v1.ReplicatedVolumeReplica) error {
	if err := a.drv.RemoveConfig(ctx, rvr.Spec.ReplicatedVolumeName); err != nil {
		return err
	}
	if rvr.Spec.Storage != nil {
		if err := a.deleteBacking(ctx, rvr); err != nil {
			return err
		}
	}
	a.mu.Lock()
	delete(a.volumes, rvr.UID)
	delete(a.written, rvr.UID)
	delete(a.held, rvr.UID)
	delete(a.freed, rvr.UID)
	// The volume's secret goes with its replica here: kept, it would stay
	// for every volume this node ever held.
	delete(a.secrets, rvr.Spec.ReplicatedVolumeName)
	a.mu.Unlock()
	if !slices.Contains(rvr.Finalizers, v1.FinalizerAgent) {
		return nil
	}
	if err := releaseFinalizer(ctx, a.client, rvr); err != nil {
		if apierrors.IsConflict(err) {
			// The release by update was refused: the replica changed since the cache
			// showed it (a status this agent wrote after the deletion, say). The cache
			// gets that change next, and its event brings the release again with the
			// replica as it is now, as a conflict of the controller's does
			// (docs/controller.md, "Writes"). Nothing is reported meanwhile: the
			// replica is down here and goes once released.
			a.log.V(1).Info("finalizer release refused for a conflict; the replica's next event retries it", "replica", rvr.Name)
			return nil
		}
		return client.IgnoreNotFound(err)
	}
	// Until the cache shows the replica gone, a reconcile of it would release it
	// again: a request refused for nothing (reconcile, releasedHere). Nothing of it is
	// left here, so its departure asks for no collector pass (released).
	a.markReleased(rvr)
	a.log.Info("replica torn down; finalizer released", "replica", rvr.Name)
	return nil
}

// releaseFinalizer removes the agent's finalizer from rvr, as the cache shows it, a
// replica deleted or of a volume that goes (leave): when it is the replica's last, by
// an update (finalizer.Release, which deletes a deleted replica; for one of a volume
// that goes, whose deletion by the controller comes next, finalizer.ReleaseBeforeDeletion;
// docs/controller.md, "Deletion"), which a status written since the cache showed rvr
// refuses with a Conflict. Otherwise someone else's finalizer stays, and with it the
// replica: a JSON patch removes this entry of metadata.finalizers only if it is still
// the agent's (test), so no one else's finalizer or field is touched, and a status
// written meanwhile (which moves the resourceVersion) does not refuse it
// (docs/contract.md, "Objects, names, writers").
func releaseFinalizer(ctx context.Context, c client.Writer, rvr *v1.ReplicatedVolumeReplica) error {
	release := finalizer.Release
	if rvr.DeletionTimestamp == nil {
		release = finalizer.ReleaseBeforeDeletion
	}
	return release(ctx, c, rvr, v1.FinalizerAgent, v1.FieldManagerAgent, func() error {
		i := slices.Index(rvr.Finalizers, v1.FinalizerAgent)
		patch, err := json.Marshal([]map[string]any{
			{"op": "test", "path": fmt.Sprintf("/metadata/finalizers/%d", i), "value": v1.FinalizerAgent},
			{"op": "remove", "path": fmt.Sprintf("/metadata/finalizers/%d", i)},
		})
		if err != nil {
			return err
		}
		return c.Patch(ctx, rvr.DeepCopy(), client.RawPatch(types.JSONPatchType, patch))
	})
}

// deleteBacking deletes the replica's own backing volume (backingKey) from its pool
// and has the node's capacity reported again.
func (a *Agent) deleteBacking(ctx context.Context, rvr *v1.ReplicatedVolumeReplica) error {
	p, err := a.provider(ctx, rvr.Spec.Storage.Pool)
	if err != nil {
		return err
	}
	if err := p.Delete(ctx, backingKey(rvr)); err != nil {
		return err
	}
	a.markCapacity()
	return nil
}

// fillKernel copies what the kernel says about the volume into st.
func (a *Agent) fillKernel(ctx context.Context, st *v1.ReplicatedVolumeReplicaStatus, rv *v1.ReplicatedVolume, rvr *v1.ReplicatedVolumeReplica, fresh bool) {
	name := rvr.Spec.ReplicatedVolumeName
	o := observed{members: map[int32]string{}}
	o.state, _ = a.obs.Snapshot(name)
	if fresh {
		if kst, err := a.drv.Status(ctx, name); err == nil && len(kst) == 1 {
			o.state = drbd.StateFromStatus(kst[0])
		}
	}
	if o.state == nil {
		return
	}
	if rv != nil {
		for _, m := range rv.Status.Datamesh.Members {
			o.members[m.NodeID] = m.Name
		}
	}
	o.device = a.drv.DevicePath(name)
	kernelStatus(st, o)
}

// writeStatus applies st when it differs from what the RVR shows and from
// what this agent last wrote. A change in resync progress alone waits until
// ProgressInterval has passed since the last write; the returned duration
// says when to come back for it.
func (a *Agent) writeStatus(ctx context.Context, rvr *v1.ReplicatedVolumeReplica, st v1.ReplicatedVolumeReplicaStatus, pace reportPacing) (time.Duration, error) {
	if sameStatus(st, rvr.Status) {
		return 0, nil
	}
	a.mu.Lock()
	last, ok := a.written[rvr.UID]
	a.mu.Unlock()
	if ok && sameStatus(st, last.status) {
		return 0, nil
	}
	progress := withoutProgress
	if pace.dayZero || pace.goingAway {
		progress = withoutPeers
	}
	switch {
	case pace.dayZero && st.DatameshRevision > rvr.Status.DatameshRevision:
		// holdBack: a day-0 member's confirmation while its disk is Inconsistent.
		if wait := a.holdBack(rvr.UID, "revision "+strconv.FormatInt(st.DatameshRevision, 10)); wait > 0 {
			return wait, nil
		}
	case pace.goingAway && sameStatus(withoutPeersOrGeneration(st), withoutPeersOrGeneration(rvr.Status)):
		if wait := a.holdBack(rvr.UID, "going away"); wait > 0 {
			return wait, nil
		}
	}
	if ok && sameStatus(progress(st), progress(last.status)) {
		if wait := a.cfg.ProgressInterval - time.Since(last.at); wait > 0 {
			return wait, nil
		}
	}
	body, err := applyBody(rvr.Name, st)
	if err != nil {
		return 0, err
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(body); err != nil {
		return 0, err
	}
	if err := a.client.Status().Patch(ctx, u, client.Apply, client.FieldOwner(v1.FieldManagerAgent), client.ForceOwnership); err != nil {
		if apierrors.IsNotFound(err) || ctx.Err() != nil {
			return 0, nil
		}
		return 0, fmt.Errorf("status of %s: %w", rvr.Name, err)
	}
	a.mu.Lock()
	a.written[rvr.UID] = writtenStatus{status: st, at: time.Now()}
	delete(a.held, rvr.UID)
	a.mu.Unlock()
	return 0, nil
}

// reportPacing says which of a replica's reports may wait (writeStatus).
type reportPacing struct {
	// dayZero: a Diskful member of a day-0 formation whose disk is still
	// Inconsistent (awaitsDayZero).
	dayZero bool
	// goingAway: a member of a deleted volume whose teardown comes next (goingAway).
	goingAway bool
}

// holdBack says how long to hold back a report of what, up to ProgressInterval from
// the first time the agent had it to send (docs/controller.md, "Write budget"):
//
//   - A day-0 member's confirmation of the formation's revision while its disk is still
//     Inconsistent. The day-0 clear needs nothing from the controller (the lowest member
//     decides from its own kernel's connections, dayZero), and the formation's next step
//     waits for every disk UpToDate anyway, so the confirmation alone moves nothing:
//     held, it goes out with the UpToDate that follows within a second or two, one
//     write per member instead of two, and the controller completes both formation
//     steps in one status write. A formation whose clear does not come shows the
//     confirmed revision within ProgressInterval, as resync progress does.
//   - A report of a deleted, unattached volume's member that moves only its peers or
//     its observed generation: its teardown is next and leaves the report unread.
func (a *Agent) holdBack(uid types.UID, what string) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	h, ok := a.held[uid]
	if !ok || h.what != what {
		h = heldReport{what: what, since: time.Now()}
		a.held[uid] = h
	}
	return a.cfg.ProgressInterval - time.Since(h.since)
}

func (a *Agent) addressStrings() []string {
	out := make([]string, 0, len(a.cfg.Addresses))
	for _, ip := range a.cfg.Addresses {
		out = append(out, ip.String())
	}
	slices.Sort(out)
	return out
}

func (a *Agent) markCapacity() {
	a.changes.Add(1)
	a.mu.Lock()
	a.capDirty = true
	a.mu.Unlock()
}
