package controller

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/sharedsecret"
)

// Allocation and the shared secret happen before the first member joins: the engine
// forms the datamesh only once the volume has its minor, size and secret, so no
// agent ever configures DRBD without them.

const (
	reasonNoAlgorithm = "NoSharedSecretAlgorithm"
	// reasonNoKey: the cluster key's Secret holds no usable key (drbdKey).
	reasonNoKey = "SharedSecretKeyUnavailable"
)

// allocate fills status.datamesh's minor, size and sharedSecret in work where they
// are missing (each member's port is given once it is a member: memberPorts). A
// non-empty why says what blocks it.
func (c *Controller) allocate(ctx context.Context, v *volume, work *v1.ReplicatedVolume) (why, reason string, err error) {
	dm := &work.Status.Datamesh
	minor, err := c.alloc.Minor(v.rv.Name)
	if err != nil {
		var ex *ExhaustedError
		if errors.As(err, &ex) {
			return err.Error(), v1.ReasonMinorsExhausted, nil
		}
		return "", "", err
	}
	dm.Minor = minor
	switch {
	case dm.Size == nil:
		q := v.rv.Spec.Size.DeepCopy()
		dm.Size = &q
	case v.rv.Spec.Size.Cmp(*dm.Size) > 0 && work.Status.DatameshRevision > 0 && len(dm.Members) > 0 &&
		len(work.Status.DatameshTransitions) == 0:
		// Expansion (spec.size only grows): publish the new size as one revision, with
		// nothing else in flight; each agent grows its backing volume, then DRBD.
		old := dm.Size.String()
		q := v.rv.Spec.Size.DeepCopy()
		dm.Size = &q
		work.Status.DatameshRevision++
		c.recorder.Eventf(v.rv, corev1.EventTypeNormal, "Expanding", "Volume size %s → %s published at revision %d",
			old, q.String(), work.Status.DatameshRevision)
	}
	// A reference once written is never changed: a volume formed with a Secret of its
	// own keeps it once every agent derives, and the controller never creates one again
	// (a new random value would differ from what the running replicas use); a derived
	// one stays derived.
	if dm.SharedSecret == nil {
		alg, ok := c.chooseAlgorithm(v)
		if !ok {
			return "No HMAC algorithm of " + strings.Join(c.opts.HMACAlgorithms, ", ") + " is offered by the nodes of storage pool " + v.poolName,
				reasonNoAlgorithm, nil
		}
		if why := derivationBlocked(v); why != "" {
			// An agent that does not know derived references would configure the
			// volume with a wrong secret, and its replicas would not connect until it
			// is upgraded: the volume gets a Secret of its own, which every agent reads
			// (docs/install.md, "Upgrading").
			if err := c.ensureOwnSecret(ctx, v.rv); err != nil {
				return "", "", err
			}
			ctrl.LoggerFrom(ctx).Info("the volume's shared secret is in a Secret of its own", "rv", v.rv.Name,
				"secret", SecretName(v.rv.Name), "why", why)
			dm.SharedSecret = &v1.SharedSecretReference{SecretName: SecretName(v.rv.Name), Key: v1.SecretKeySharedSecret, Algorithm: alg}
			return "", "", nil
		}
		fingerprint, why, err := c.drbdKey(ctx)
		if err != nil || why != "" {
			return why, reasonNoKey, err
		}
		dm.SharedSecret = &v1.SharedSecretReference{
			SecretName: v1.SecretDRBDKey, Key: v1.SecretKeyDRBDKey, Algorithm: alg,
			Derivation: v1.DerivationHMACSHA256, KeyFingerprint: fingerprint,
		}
	}
	return "", "", nil
}

// derivationBlocked says why a new volume's secret may not be derived now ("" when it
// may): an agent that does not announce it knows derived references. The installed
// ReplicatedVolume CRD keeps their fields: the controller does not start on one that
// would drop them (CheckCRDs).
func derivationBlocked(v *volume) string {
	if node := derivationHoldout(v.leases, v.nodes); node != "" {
		return "the agent of node " + node + " does not announce " + v1.CapabilityDerivedSharedSecret + " on its Lease"
	}
	return ""
}

// derivationHoldout names a node whose agent does not announce
// CapabilityDerivedSharedSecret on its Lease ("" when every agent does; the first by
// name, so that the log says the same from one pass to the next). Every agent Lease
// counts, live or not, whatever its pool, in maintenance or not: a node whose agent is
// away (restarting, rolled by the DaemonSet, in maintenance) comes back with a version
// that may lag, and an Access replica may go to any node with an agent. A Lease whose
// Node is gone does not count: no agent runs there any more, and an agent that comes
// back under that name renews the Lease (voiding an older agent's announcement) before
// placement gives it a replica. A node whose agent never ran has no Lease and holds no
// replica until it has one. Both maps are the caches' (docs/controller.md, "Allocation
// and the shared secret").
func derivationHoldout(leases map[string]*coordinationv1.Lease, nodes map[string]*corev1.Node) string {
	holdout := ""
	for node, l := range leases {
		if nodes[node] == nil || agentlease.Announces(l, v1.CapabilityDerivedSharedSecret) {
			continue
		}
		if holdout == "" || node < holdout {
			holdout = node
		}
	}
	return holdout
}

// ensureOwnSecret makes sure the volume has its own Secret SecretName(rv) (key
// SecretKeySharedSecret: 32 bytes from crypto/rand, base64url-encoded: 43 printable
// characters, within DRBD's 64-character limit), creating it when the cache has none.
// It is called only while the volume has no reference yet, so no replica uses a value
// yet: one found in the cache (a pass whose status write failed made it) is kept, unless
// it belongs to an earlier volume of the same name (its owner's UID), which is deleted
// and made again — the garbage collector would delete it under the new volume. The
// value is never logged, never put in an event, a status or an error.
func (c *Controller) ensureOwnSecret(ctx context.Context, rv *v1.ReplicatedVolume) error {
	name := types.NamespacedName{Namespace: c.opts.Namespace, Name: SecretName(rv.Name)}
	cached := &corev1.Secret{}
	switch err := c.reader.Get(ctx, name, cached); {
	case err == nil:
		if ownedBy(cached, rv) && cached.DeletionTimestamp == nil {
			return nil
		}
		uid := cached.UID
		err := c.client.Delete(ctx, cached, client.Preconditions{UID: &uid})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting Secret %s of an earlier volume of the same name: %s", name, apierrors.ReasonForError(err))
		}
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("reading Secret %s: %w", name, err)
	}
	raw, err := sharedsecret.NewKey() // as many random bytes as the cluster key
	if err != nil {
		return fmt.Errorf("generating the shared secret of %s: %w", rv.Name, err)
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: name.Name, Namespace: name.Namespace,
			Labels: map[string]string{v1.LabelVolume: rv.Name},
			// The RV owns it, so it cannot outlive a volume whose finalizer was
			// removed by hand; normally the controller deletes it last (releaseVolume).
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1.SchemeGroupVersion.String(), Kind: "ReplicatedVolume", Name: rv.Name, UID: rv.UID}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{v1.SecretKeySharedSecret: []byte(base64.RawURLEncoding.EncodeToString(raw))},
	}
	err = c.client.Create(ctx, s)
	if apierrors.IsAlreadyExists(err) {
		// Made by an earlier pass the cache has not shown yet, or one the cache has
		// not shown of an earlier volume (or still being deleted): only the first
		// will do, and the apiserver says which (a rare case: one request).
		held := &corev1.Secret{}
		if err := c.api.Get(ctx, name, held); err != nil {
			return fmt.Errorf("reading Secret %s, created meanwhile: %s", name, apierrors.ReasonForError(err))
		}
		if !ownedBy(held, rv) || held.DeletionTimestamp != nil {
			return fmt.Errorf("secret %s: held by an earlier volume of the same name (owner UID not %s), or being deleted; the next pass replaces it", name, rv.UID)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating Secret %s: %s", name, apierrors.ReasonForError(err))
	}
	return nil
}

// ownedBy: the Secret names rv (this incarnation of the name, by UID) as its owner.
func ownedBy(s *corev1.Secret, rv *v1.ReplicatedVolume) bool {
	for _, o := range s.OwnerReferences {
		if o.Kind == "ReplicatedVolume" && o.UID == rv.UID {
			return true
		}
	}
	return false
}

// drbdKey is the fingerprint of the cluster key every new volume's shared secret is
// derived from (docs/controller.md, "Allocation and the shared secret"), creating the
// key's Secret when it is absent. A non-empty why says what blocks it (a key Secret
// someone else wrote, holding no usable key). The key is 32 bytes from crypto/rand; it
// is never logged, never put in an event, a status or an error, and never rotated.
//
// A key Secret deleted is made again with a new key: the volumes formed since derive
// their secrets from it, and the agents refuse to derive the older volumes' secrets
// from it (their status names the old key's fingerprint) until the old Secret is
// restored; the kernels keep running what they run meanwhile.
//
// Only the leader reconciles, so only it creates the key; two controllers racing at a
// hand-over both create, one gets AlreadyExists and reads the other's key from the
// apiserver (the cache may not have it yet), so every volume gets the one key stored.
func (c *Controller) drbdKey(ctx context.Context) (fingerprint, why string, err error) {
	name := types.NamespacedName{Namespace: c.opts.Namespace, Name: v1.SecretDRBDKey}
	s := &corev1.Secret{}
	switch err := c.reader.Get(ctx, name, s); {
	case apierrors.IsNotFound(err):
		if s, err = c.createKey(ctx); err != nil {
			return "", "", err
		}
	case err != nil:
		return "", "", fmt.Errorf("reading Secret %s: %w", name, err)
	}
	key := s.Data[v1.SecretKeyDRBDKey]
	if err := sharedsecret.CheckKey("Secret "+name.String()+" data."+v1.SecretKeyDRBDKey, key); err != nil {
		return "", err.Error() + " (the cluster key every new volume's DRBD shared secret is derived from)", nil
	}
	return sharedsecret.Fingerprint(key), "", nil
}

// createKey creates the key's Secret, or reads the one another controller created.
func (c *Controller) createKey(ctx context.Context) (*corev1.Secret, error) {
	key, err := sharedsecret.NewKey()
	if err != nil {
		return nil, err
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: v1.SecretDRBDKey, Namespace: c.opts.Namespace,
			// No owner: the key outlives every volume, and a volume formed later
			// derives its secret from the same key.
			Labels: map[string]string{"app.kubernetes.io/managed-by": "meshvol"},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{v1.SecretKeyDRBDKey: key},
	}
	err = c.client.Create(ctx, s)
	if apierrors.IsAlreadyExists(err) {
		key := client.ObjectKeyFromObject(s)
		s = &corev1.Secret{}
		if err := c.api.Get(ctx, key, s); err != nil {
			return nil, fmt.Errorf("reading Secret %s/%s, created meanwhile: %s", c.opts.Namespace, v1.SecretDRBDKey, apierrors.ReasonForError(err))
		}
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("creating Secret %s/%s: %s", c.opts.Namespace, v1.SecretDRBDKey, apierrors.ReasonForError(err))
	}
	return s, nil
}

// chooseAlgorithm picks the volume's cram-hmac-alg (docs/controller.md, "Allocation and
// the shared secret"): the first of
// the preference list that every node of the pool offers (annotation
// storage.meshvol.io/hmac-algorithms on its agent Lease); if none is common, the first
// that most of them offer (placement then keeps replicas off the others). Nodes whose
// agent does not report are not asked.
func (c *Controller) chooseAlgorithm(v *volume) (string, bool) {
	var offers [][]string
	for _, e := range v.eligible {
		if l := v.leases[e.NodeName]; l != nil {
			if s, ok := l.Annotations[v1.AnnotationHMACAlgorithms]; ok {
				offers = append(offers, splitList(s))
			}
		}
	}
	return ChooseAlgorithm(c.opts.HMACAlgorithms, offers)
}

// ChooseAlgorithm is chooseAlgorithm's rule on plain lists.
func ChooseAlgorithm(pref []string, offers [][]string) (string, bool) {
	if len(offers) == 0 {
		return pref[0], true
	}
	best, bestN := "", 0
	for _, a := range pref {
		n := 0
		for _, o := range offers {
			if slices.Contains(o, a) {
				n++
			}
		}
		if n == len(offers) {
			return a, true
		}
		if n > bestN {
			best, bestN = a, n
		}
	}
	return best, bestN > 0
}

// offersAlgorithm: the node's agent offers alg, or does not say.
func offersAlgorithm(v *volume, node, alg string) bool {
	l := v.leases[node]
	if l == nil || alg == "" {
		return true
	}
	s, ok := l.Annotations[v1.AnnotationHMACAlgorithms]
	return !ok || slices.Contains(splitList(s), alg)
}
