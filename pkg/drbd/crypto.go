package drbd

import (
	"bufio"
	"bytes"
	"os"
	"slices"
	"strings"
)

// DRBD asks the kernel's crypto API for two hashes by name: cram-hmac-alg
// (peer authentication, used as hmac(<alg>)) and verify-alg (online
// verify). A name the kernel cannot provide makes `drbdadm adjust` fail on
// that node, and the two ends of a connection must use the same ones, so
// each is negotiated like this: every node's agent publishes what its
// kernel offers (KernelHashAlgorithms, on its Lease), and the controller
// picks the first name of its preference list that every member offers
// (Negotiate), for the whole resource.

// HMACAlgPreference is the order in which meshvol picks cram-hmac-alg
// (the ReplicatedVolume API admits exactly these).
var HMACAlgPreference = []string{"sha256", "sha1", "md5"}

// VerifyAlgPreference is the order in which meshvol picks verify-alg. A
// verify compares digests of every block on both ends: crc32c is
// hardware-assisted on most CPUs and enough to detect corruption (DRBD's
// own documentation suggests it); the others follow in case a kernel lacks
// it.
var VerifyAlgPreference = []string{"crc32c", "sha256", "sha1", "md5"}

// ParseProcCrypto returns the names of the hash algorithms (types shash and
// ahash) listed in /proc/crypto, in the kernel's order, each once. Names
// with a template ("hmac(sha256)") are left out: DRBD composes hmac(...)
// itself. /proc/crypto lists what is loaded; the kernel may load more on
// demand, so the list is what is certainly available.
func ParseProcCrypto(data []byte) []string {
	var out []string
	name := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "name":
			name = v
		case "type":
			if (v == "shash" || v == "ahash") && name != "" && !strings.Contains(name, "(") && !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	return out
}

// KernelHashAlgorithms reads /proc/crypto (procCrypto, "" for the real one).
func KernelHashAlgorithms(procCrypto string) ([]string, error) {
	if procCrypto == "" {
		procCrypto = "/proc/crypto"
	}
	data, err := os.ReadFile(procCrypto)
	if err != nil {
		return nil, err
	}
	return ParseProcCrypto(data), nil
}

// Negotiate returns the first name in preference that every list in
// offered contains, or "" when there is none (or no list at all).
func Negotiate(preference []string, offered ...[]string) string {
	if len(offered) == 0 {
		return ""
	}
	for _, alg := range preference {
		everywhere := true
		for _, o := range offered {
			if !slices.Contains(o, alg) {
				everywhere = false
				break
			}
		}
		if everywhere {
			return alg
		}
	}
	return ""
}
