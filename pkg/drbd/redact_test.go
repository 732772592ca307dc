package drbd

import (
	"strings"
	"testing"
)

// TestRedactSecrets covers each way a shared secret reaches a message: a .res or
// show line, show --json, a Go map print of parsed show output, and an error that
// quotes a configuration line with an unquoted value (what the agent puts in its
// conditions and logs).
func TestRedactSecrets(t *testing.T) {
	for _, in := range []string{
		`net { shared-secret "abc"; cram-hmac-alg sha256; }`,
		`{"shared-secret": "abc", "cram-hmac-alg": "sha256"}`,
		`map[cram-hmac-alg:sha256 shared-secret:abc]`,
		`bad line: shared-secret "abc"; and shared-secret xyz`,
		"shared-secret=abc\nshared-secret \"x\\\"yz\";",
	} {
		got := RedactSecrets(in)
		for _, secret := range []string{"abc", "xyz"} {
			if strings.Contains(got, secret) {
				t.Errorf("RedactSecrets(%q) = %q: %q is still there", in, got, secret)
			}
		}
		if !strings.Contains(got, Redacted) {
			t.Errorf("RedactSecrets(%q) = %q: no %s marks what was removed", in, got, Redacted)
		}
		if strings.Contains(in, "cram-hmac-alg") && !strings.Contains(got, "sha256") {
			t.Errorf("RedactSecrets(%q) = %q: it removed more than the secret", in, got)
		}
	}
}
