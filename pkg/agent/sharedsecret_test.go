package agent_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/sharedsecret"
)

// A volume whose shared secret is derived from the cluster key (docs/contract.md, "The
// shared secret"): every node's DRBD runs the secret derived from the key for the
// volume's UID; a key Secret replaced is noticed by the fingerprint a revision names
// (the key each agent read once is read again); and a revision naming a key the Secret
// no longer holds is refused with a condition that names the Secret and the rule, the
// kernel keeping the secret it runs.
func TestDerivedSharedSecret(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	key := func(k []byte) *v1.SharedSecretReference {
		r.must(r.cl.Create(r.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: r.c.Namespace, Name: v1.SecretDRBDKey},
			Data: map[string][]byte{v1.SecretKeyDRBDKey: k}}))
		return &v1.SharedSecretReference{SecretName: v1.SecretDRBDKey, Key: v1.SecretKeyDRBDKey, Algorithm: "sha256",
			Derivation: v1.DerivationHMACSHA256, KeyFingerprint: sharedsecret.Fingerprint(k)}
	}
	rv := &v1.ReplicatedVolume{}
	r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: r.rv}, rv))
	runs := func(want string) {
		r.t.Helper()
		r.eventually("every node's DRBD runs the derived secret", time.Minute, func() string {
			for i := range 3 {
				sh, err := r.node(i).Sim.Show(r.ctx, r.rv)
				if err != nil || len(sh) != 1 || len(sh[0].Connections) != 2 {
					return fmt.Sprintf("show on %s: %d resources, %v", r.node(i).Name, len(sh), err)
				}
				for _, c := range sh[0].Connections {
					if c.Net["shared-secret"] != want {
						return fmt.Sprintf("%s → %s runs another secret", r.node(i).Name, c.Name())
					}
				}
			}
			return ""
		})
	}

	k1, err := sharedsecret.NewKey()
	r.must(err)
	first := key(k1)
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.SharedSecret = first })
	r.confirmed(rev, v1.DiskStateUpToDate, names...)
	runs(sharedsecret.Derive(k1, rv.UID))

	// The key Secret deleted and created again with another key: a revision naming the
	// new key's fingerprint is applied (each agent reads the key again).
	r.must(r.cl.Delete(r.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: r.c.Namespace, Name: v1.SecretDRBDKey}}))
	k2, err := sharedsecret.NewKey()
	r.must(err)
	second := key(k2)
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.SharedSecret = second })
	r.confirmed(rev, v1.DiskStateUpToDate, names...)
	runs(sharedsecret.Derive(k2, rv.UID))

	// A revision naming the first key, which the Secret no longer holds: refused.
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.SharedSecret = first })
	r.eventually("every replica refuses the first key's fingerprint", time.Minute, func() string {
		for _, n := range names {
			c := meta.FindStatusCondition(r.rvr(n).Status.Conditions, v1.ConditionDRBDConfigured)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1.ReasonConfigurationFailed ||
				!strings.Contains(c.Message, "status.datamesh.sharedSecret.keyFingerprint: is "+first.KeyFingerprint) ||
				!strings.Contains(c.Message, "Secret "+r.c.Namespace+"/"+v1.SecretDRBDKey+" holds a key of fingerprint "+second.KeyFingerprint) {
				return fmt.Sprintf("%s: %v", n, c)
			}
			if got := r.rvr(n).Status.DatameshRevision; got >= rev {
				return fmt.Sprintf("%s confirmed revision %d", n, got)
			}
		}
		return ""
	})
	runs(sharedsecret.Derive(k2, rv.UID))
	for _, n := range names {
		c := meta.FindStatusCondition(r.rvr(n).Status.Conditions, v1.ConditionDRBDConfigured)
		if strings.Contains(c.Message, sharedsecret.Derive(k1, rv.UID)) || strings.Contains(c.Message, sharedsecret.Derive(k2, rv.UID)) {
			t.Fatalf("%s: the condition carries a secret", n)
		}
	}
}
