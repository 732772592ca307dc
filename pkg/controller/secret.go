package controller

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Allocation and the shared secret happen before the first member joins: the engine
// forms the datamesh only once the volume has its minor, size and secret, so no
// agent ever configures DRBD without them.

const (
	reasonNoAlgorithm = "NoSharedSecretAlgorithm"
)

// allocate fills status.datamesh's minor, size and sharedSecret in work where they
// are missing, creating the Secret if needed (each member's port is given once it is a
// member: memberPorts). A non-empty why says what blocks it.
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
	if err := c.ensureSecret(ctx, v.rv); err != nil {
		return "", "", err
	}
	if dm.SharedSecret == nil {
		alg, ok := c.chooseAlgorithm(v)
		if !ok {
			return "No HMAC algorithm of " + strings.Join(c.opts.HMACAlgorithms, ", ") + " is offered by the nodes of storage pool " + v.poolName,
				reasonNoAlgorithm, nil
		}
		dm.SharedSecret = &v1.SharedSecretReference{SecretName: SecretName(v.rv.Name), Key: v1.SecretKeySharedSecret, Algorithm: alg}
	}
	return "", "", nil
}

// ensureSecret creates the volume's Secret if the cache does not have it. The secret is
// 32 bytes from crypto/rand, stored base64url-encoded (43 printable characters, within
// DRBD's 64-character shared-secret limit, and safe to put in a config file as is).
// The value is never logged, never put in an event, a status or an error.
func (c *Controller) ensureSecret(ctx context.Context, rv *v1.ReplicatedVolume) error {
	name := SecretName(rv.Name)
	s := &corev1.Secret{}
	err := c.reader.Get(ctx, types.NamespacedName{Namespace: c.opts.Namespace, Name: name}, s)
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading Secret %s/%s: %w", c.opts.Namespace, name, err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return fmt.Errorf("generating the shared secret of %s: %w", rv.Name, err)
	}
	s = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: c.opts.Namespace,
			Labels: map[string]string{v1.LabelVolume: rv.Name},
			// The RV owns it, so it cannot outlive a volume whose finalizer was removed by
			// hand; normally the controller deletes it last.
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1.SchemeGroupVersion.String(), Kind: "ReplicatedVolume", Name: rv.Name, UID: rv.UID}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{v1.SecretKeySharedSecret: []byte(base64.RawURLEncoding.EncodeToString(raw))},
	}
	err = c.client.Create(ctx, s)
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating Secret %s/%s: %s", c.opts.Namespace, name, apierrors.ReasonForError(err))
	}
	return nil
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
