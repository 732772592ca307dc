package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// The sandbox's resizer: what external-resizer does for a CSI driver, for
// meshvol's volumes in the sandbox, where external-resizer cannot be built
// (the module proxy refuses it, hack/build-k8s.sh; the chart keeps the
// upstream image for real clusters). It runs in the sandbox's process, not
// in meshvol's binary or image.
//
// Kubernetes grows a PVC in three hands: kube-controller-manager's expand
// controller sees a bound claim's request exceed its capacity and, the
// volume being CSI, leaves it to the external resizer of the PV's driver
// (event ExternalExpanding; the annotation volume.kubernetes.io/
// storage-resizer only names a migrated in-tree volume's); the resizer calls
// ControllerExpandVolume and records the result on the PV and the claim;
// the kubelet of a node where the volume is mounted then calls
// NodeExpandVolume and marks the claim done. The resizer's part, as
// external-resizer v1.13 does it with RecoverVolumeExpansionFailure (on by
// default since Kubernetes 1.32):
//
//  1. claim status: allocatedResources.storage = the request,
//     allocatedResourceStatuses.storage = ControllerResizeInProgress,
//     condition Resizing;
//  2. ControllerExpandVolume with the PV's volume handle and capability;
//  3. PV spec.capacity = the size it answered;
//  4. node expansion required: condition FileSystemResizePending and
//     allocatedResourceStatuses.storage = NodeResizePending, which is what
//     makes the kubelet call NodeExpandVolume (pkg/volume/util/
//     operationexecutor/node_expander.go); otherwise status.capacity = the
//     new size, conditions and the resize status cleared;
//  5. a failure is an event on the claim and a retry with backoff; a
//     refusal for good (InvalidArgument, OutOfRange, ResourceExhausted…)
//     is ControllerResizeInfeasible, retried as the user changes the
//     request.

// resizerAnnotation names a claim's resizer: kube-controller-manager writes
// it for a volume migrated from an in-tree plugin to a CSI driver.
const resizerAnnotation = "volume.kubernetes.io/storage-resizer"

// resizer is a running sandbox resizer.
type resizer struct {
	kube   kubernetes.Interface
	socket func(context.Context) (string, error)
	log    logr.Logger
	events record.EventRecorder
	queue  workqueue.TypedRateLimitingInterface[types.NamespacedName]
	pvcs   cache.Indexer
}

// startResizer runs the resizer until ctx ends. socket resolves the CSI
// controller socket before each call (the controller pod serving it may
// change: upgrades, leader hand-overs).
func startResizer(ctx context.Context, cfg *rest.Config, socket func(context.Context) (string, error), log logr.Logger) (<-chan struct{}, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	bc := record.NewBroadcaster(record.WithContext(ctx))
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	r := &resizer{
		kube:   kube,
		socket: socket,
		log:    log.WithName("resizer"),
		events: bc.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "meshvol-sandbox-resizer"}),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](500*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "resizer"}),
	}
	f := informers.NewSharedInformerFactory(kube, 0)
	inf := f.Core().V1().PersistentVolumeClaims().Informer()
	enqueue := func(obj any) {
		if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok && needsResize(pvc) {
			r.queue.Add(types.NamespacedName{Namespace: pvc.Namespace, Name: pvc.Name})
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return nil, err
	}
	r.pvcs = inf.GetIndexer()
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, errors.New("sandbox: the resizer's claim cache did not sync")
	}
	done := make(chan struct{})
	go func() {
		<-ctx.Done()
		r.queue.ShutDown()
	}()
	go func() {
		defer close(done)
		defer bc.Shutdown()
		for r.next(ctx) {
		}
		f.Shutdown()
	}()
	return done, nil
}

// needsResize: a bound claim whose request exceeds both its capacity and
// what a resize already reached, not given up on for this request, and not
// named to another resizer (resize checks that its PV is meshvol's).
func needsResize(pvc *corev1.PersistentVolumeClaim) bool {
	if r, ok := pvc.Annotations[resizerAnnotation]; pvc.Status.Phase != corev1.ClaimBound || (ok && r != v1.CSIDriverName) {
		return false
	}
	want, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	have := pvc.Status.Capacity[corev1.ResourceStorage]
	if !ok || want.Cmp(have) <= 0 {
		return false
	}
	switch pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] {
	case corev1.PersistentVolumeClaimNodeResizePending, corev1.PersistentVolumeClaimNodeResizeInProgress:
		// The controller's part is done; the kubelet's is next.
		allocated := pvc.Status.AllocatedResources[corev1.ResourceStorage]
		return want.Cmp(allocated) > 0
	case corev1.PersistentVolumeClaimControllerResizeInfeasible:
		allocated := pvc.Status.AllocatedResources[corev1.ResourceStorage]
		return want.Cmp(allocated) != 0
	}
	return true
}

func (r *resizer) next(ctx context.Context) bool {
	key, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(key)
	err := r.resize(ctx, key)
	switch {
	case err == nil:
		r.queue.Forget(key)
	case ctx.Err() != nil:
	default:
		r.log.Info("resize failed; retrying", "pvc", key.String(), "error", err.Error())
		r.queue.AddRateLimited(key)
	}
	return true
}

// resize grows one claim's volume: steps 1-4 above.
func (r *resizer) resize(ctx context.Context, key types.NamespacedName) error {
	obj, exists, err := r.pvcs.GetByKey(key.String())
	if err != nil || !exists {
		return err
	}
	pvc := obj.(*corev1.PersistentVolumeClaim).DeepCopy()
	if !needsResize(pvc) {
		return nil
	}
	pv, err := r.kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != v1.CSIDriverName {
		return nil
	}
	want := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if pvc, err = r.setStatus(ctx, pvc, func(st *corev1.PersistentVolumeClaimStatus) {
		setAllocated(st, want, corev1.PersistentVolumeClaimControllerResizeInProgress)
		st.Conditions = resizeConditions(st.Conditions, corev1.PersistentVolumeClaimResizing, "")
	}); err != nil {
		return err
	}
	r.events.Event(pvc, corev1.EventTypeNormal, "Resizing", "External resizer is resizing volume "+pv.Name)
	got, nodeExpand, err := r.expand(ctx, pv, want)
	if err != nil {
		r.events.Event(pvc, corev1.EventTypeWarning, "VolumeResizeFailed", err.Error())
		if infeasible(err) {
			_, serr := r.setStatus(ctx, pvc, func(st *corev1.PersistentVolumeClaimStatus) {
				setAllocated(st, want, corev1.PersistentVolumeClaimControllerResizeInfeasible)
				st.Conditions = resizeConditions(st.Conditions, corev1.PersistentVolumeClaimControllerResizeError, err.Error())
			})
			return errors.Join(err, serr)
		}
		return err
	}
	if got.Cmp(pv.Spec.Capacity[corev1.ResourceStorage]) > 0 {
		pv.Spec.Capacity[corev1.ResourceStorage] = got
		if _, err := r.kube.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	if nodeExpand {
		_, err = r.setStatus(ctx, pvc, func(st *corev1.PersistentVolumeClaimStatus) {
			setAllocated(st, want, corev1.PersistentVolumeClaimNodeResizePending)
			st.Conditions = resizeConditions(st.Conditions, corev1.PersistentVolumeClaimFileSystemResizePending,
				"Waiting for user to (re-)start a pod to finish file system resize of volume on node.")
		})
		if err == nil {
			r.events.Event(pvc, corev1.EventTypeNormal, "FileSystemResizeRequired", "Require file system resize of volume on node")
		}
		return err
	}
	_, err = r.setStatus(ctx, pvc, func(st *corev1.PersistentVolumeClaimStatus) {
		st.Capacity[corev1.ResourceStorage] = got
		delete(st.AllocatedResourceStatuses, corev1.ResourceStorage)
		st.Conditions = resizeConditions(st.Conditions, "", "")
	})
	if err == nil {
		r.events.Event(pvc, corev1.EventTypeNormal, "VolumeResizeSuccessful", "Resize volume succeeded")
	}
	return err
}

// expand calls ControllerExpandVolume through the controller socket.
func (r *resizer) expand(ctx context.Context, pv *corev1.PersistentVolume, want resource.Quantity) (resource.Quantity, bool, error) {
	sock, err := r.socket(ctx)
	if err != nil {
		return resource.Quantity{}, false, err
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return resource.Quantity{}, false, err
	}
	defer conn.Close()
	// external-resizer's default --timeout is 10 s and it retries; the
	// CSI service answers Unavailable or DeadlineExceeded while replicas
	// grow, which a retry picks up.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := csipb.NewControllerClient(conn).ControllerExpandVolume(cctx, &csipb.ControllerExpandVolumeRequest{
		VolumeId:         pv.Spec.CSI.VolumeHandle,
		CapacityRange:    &csipb.CapacityRange{RequiredBytes: want.Value()},
		VolumeCapability: volumeCapability(pv),
	})
	if err != nil {
		return resource.Quantity{}, false, fmt.Errorf("ControllerExpandVolume of %s: %w", pv.Spec.CSI.VolumeHandle, err)
	}
	return *resource.NewQuantity(res.CapacityBytes, resource.BinarySI), res.NodeExpansionRequired, nil
}

// infeasible: errors external-resizer treats as final for the request
// (the user must change it), not as transient.
func infeasible(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.OutOfRange, codes.NotFound, codes.ResourceExhausted, codes.FailedPrecondition:
		return true
	}
	return false
}

// volumeCapability is the PV's capability as external-resizer passes it.
func volumeCapability(pv *corev1.PersistentVolume) *csipb.VolumeCapability {
	c := &csipb.VolumeCapability{AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	for _, m := range pv.Spec.AccessModes {
		switch m {
		case corev1.ReadWriteOncePod:
			c.AccessMode.Mode = csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		case corev1.ReadWriteMany:
			c.AccessMode.Mode = csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
		case corev1.ReadOnlyMany:
			if len(pv.Spec.AccessModes) == 1 {
				c.AccessMode.Mode = csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
			}
		}
	}
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		c.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
	} else {
		c.AccessType = &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: pv.Spec.CSI.FSType}}
	}
	return c
}

func setAllocated(st *corev1.PersistentVolumeClaimStatus, size resource.Quantity, state corev1.ClaimResourceStatus) {
	if st.AllocatedResources == nil {
		st.AllocatedResources = corev1.ResourceList{}
	}
	st.AllocatedResources[corev1.ResourceStorage] = size
	if st.AllocatedResourceStatuses == nil {
		st.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{}
	}
	st.AllocatedResourceStatuses[corev1.ResourceStorage] = state
}

// resizeConditions replaces the claim's resize conditions with one of
// type t (none when t is empty), keeping the others.
func resizeConditions(conds []corev1.PersistentVolumeClaimCondition, t corev1.PersistentVolumeClaimConditionType, msg string) []corev1.PersistentVolumeClaimCondition {
	var out []corev1.PersistentVolumeClaimCondition
	for _, c := range conds {
		switch c.Type {
		case corev1.PersistentVolumeClaimResizing, corev1.PersistentVolumeClaimFileSystemResizePending,
			corev1.PersistentVolumeClaimControllerResizeError, corev1.PersistentVolumeClaimNodeResizeError:
			continue
		}
		out = append(out, c)
	}
	if t != "" {
		out = append(out, corev1.PersistentVolumeClaimCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now(), Message: msg})
	}
	return out
}

// setStatus updates the claim's status with change applied (a conflict is
// retried by the queue with the cache's newer copy).
func (r *resizer) setStatus(ctx context.Context, pvc *corev1.PersistentVolumeClaim, change func(*corev1.PersistentVolumeClaimStatus)) (*corev1.PersistentVolumeClaim, error) {
	pvc = pvc.DeepCopy()
	if pvc.Status.Capacity == nil {
		pvc.Status.Capacity = corev1.ResourceList{}
	}
	change(&pvc.Status)
	out, err := r.kube.CoreV1().PersistentVolumeClaims(pvc.Namespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return nil, fmt.Errorf("claim %s/%s changed meanwhile: %w", pvc.Namespace, pvc.Name, err)
	}
	return out, err
}

// resizerSocket is the CSI controller socket the resizer calls: the
// in-process service's, or a Ready controller pod's through a link of its
// own (the one in Sandbox.ControllerSocket belongs to the tests).
func (s *Sandbox) resizerSocket(ctx context.Context) (string, error) {
	if s.simd == nil {
		return s.ControllerSocket, nil
	}
	return s.linkControllerSocket(ctx, filepath.Join(s.opts.Dir, "resizer-controller.sock"))
}

// startResizerFor starts the sandbox's resizer, logging to the sandbox's log.
func (s *Sandbox) startResizerFor(ctx context.Context) error {
	done, err := startResizer(ctx, rest.CopyConfig(s.Kube.Env.Config), s.resizerSocket, s.opts.Log)
	if err != nil {
		return err
	}
	s.resizerDone = done
	return nil
}
