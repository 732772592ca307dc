// Package sharedsecret derives each volume's DRBD shared secret from one cluster key
// (docs/contract.md, "The shared secret"): the controller keeps the key in one Secret
// and references it from every volume's status.datamesh.sharedSecret with the key's
// fingerprint; each agent derives the volume's secret from the key and the volume's UID.
// A new volume therefore needs no Secret of its own: no create at formation, no delete
// at deletion, no object per volume in the namespace (docs/scale.md, "Eighth pass: one
// key, no Secret per volume").
//
// It is a package of its own because the controller (the key, its fingerprint) and the
// agent (the derivation) must agree on every byte.
package sharedsecret

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
)

// KeyLen is the length of a key the controller generates, and the least it accepts
// in a key Secret written by someone else: HMAC-SHA256 gains nothing from a longer one
// and is weakened by a shorter one.
const KeyLen = 32

// The contexts keep the two uses of the key apart: a fingerprint is never a volume's
// secret, whatever the UID. They are fixed forever: changing either changes every
// volume's secret, or every fingerprint, under running replicas.
const (
	secretContext      = "meshvol drbd shared-secret v1\x00"
	fingerprintContext = "meshvol drbd key fingerprint v1"
)

// NewKey is a new cluster key: KeyLen bytes from crypto/rand.
func NewKey() ([]byte, error) {
	key := make([]byte, KeyLen)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("generating the DRBD key: %w", err)
	}
	return key, nil
}

// CheckKey says why key cannot be a cluster key (nil when it can). field names where
// it was read, for the message.
func CheckKey(field string, key []byte) error {
	if len(key) < KeyLen {
		return fmt.Errorf("%s: is %d bytes, must be at least %d", field, len(key), KeyLen)
	}
	return nil
}

// Fingerprint is the key's fingerprint: 16 lowercase hex digits (the first 8 bytes of
// an HMAC of a fixed context under the key). It tells keys apart and reveals nothing
// of the key; a status carries it so that an agent refuses to derive a volume's secret
// from any other key than the one the volume was formed with.
func Fingerprint(key []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(fingerprintContext))
	return hex.EncodeToString(m.Sum(nil)[:8])
}

// Derive is the volume's DRBD shared secret: HMAC-SHA256 under the key of a fixed
// context and the volume's UID, base64url-encoded without padding: 43 printable
// characters, within DRBD's 63, the same form as a per-volume Secret's random value.
// The UID, not the name: a volume created again under the same name gets another
// secret, so a replica of the old one left on a node cannot connect to the new one.
func Derive(key []byte, uid types.UID) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(secretContext))
	m.Write([]byte(uid))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}
