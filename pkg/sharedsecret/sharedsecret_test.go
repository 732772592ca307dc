package sharedsecret

import (
	"bytes"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// testKey is bytes 0..31.
func testKey() []byte {
	k := make([]byte, KeyLen)
	for i := range k {
		k[i] = byte(i)
	}
	return k
}

// TestKnownAnswer pins the derivation and the fingerprint to values computed apart
// from this code (Python's hmac over the same contexts): a change of either would
// change every volume's secret under running replicas.
func TestKnownAnswer(t *testing.T) {
	const uid = types.UID("6f1c2d3e-0a1b-4c5d-8e9f-a0b1c2d3e4f5")
	if got, want := Derive(testKey(), uid), "k_YqsShuE_vqBnm3PUyr1p43N_ZyvM9fdgFuIXJ8M9w"; got != want {
		t.Errorf("Derive = %q, want %q", got, want)
	}
	if got, want := Fingerprint(testKey()), "a056d92a0ef9f0f5"; got != want {
		t.Errorf("Fingerprint = %q, want %q", got, want)
	}
}

// TestDeriveFitsDRBD: 43 characters DRBD takes as they are (the agent's rule for a
// Secret's value, docs/contract.md "The shared secret", and drbd's validation).
func TestDeriveFitsDRBD(t *testing.T) {
	s := Derive(testKey(), "uid")
	if len(s) != 43 || len(s) > drbd.MaxSharedSecretLen {
		t.Fatalf("len %d, want 43", len(s))
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c > '~' || c == '"' || c == '\\' {
			t.Fatalf("%q: character %q DRBD's config would not take as is", s, c)
		}
	}
}

func TestDifferentInputsDiffer(t *testing.T) {
	other := testKey()
	other[0] ^= 1
	a := Derive(testKey(), "uid-a")
	for name, b := range map[string]string{
		"another UID":                    Derive(testKey(), "uid-b"),
		"another key":                    Derive(other, "uid-a"),
		"a UID that extends the context": Derive(testKey(), "uid-a\x00"),
	} {
		if a == b {
			t.Errorf("%s: same secret %q", name, a)
		}
	}
	if Fingerprint(testKey()) == Fingerprint(other) {
		t.Error("two keys have one fingerprint")
	}
	// The fingerprint is not a secret's prefix under any UID: they use other contexts.
	if strings.HasPrefix(Derive(testKey(), ""), Fingerprint(testKey())) {
		t.Error("fingerprint is a prefix of a secret")
	}
}

func TestNewKey(t *testing.T) {
	a, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != KeyLen || bytes.Equal(a, b) {
		t.Fatalf("two keys: %d bytes, equal %v", len(a), bytes.Equal(a, b))
	}
	if err := CheckKey("data.key", a); err != nil {
		t.Fatal(err)
	}
}

func TestCheckKeyRefusesShort(t *testing.T) {
	err := CheckKey("data.key", make([]byte, KeyLen-1))
	if err == nil || !strings.Contains(err.Error(), "data.key: is 31 bytes, must be at least 32") {
		t.Fatalf("got %v", err)
	}
}
