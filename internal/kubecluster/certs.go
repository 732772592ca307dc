package kubecluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// kubeletPKI is how the apiserver and the kubelets trust each other for the
// apiserver → kubelet direction (logs, exec, port-forward): a CA of the
// cluster's own, the kubelets accept client certificates it signed
// (authentication.x509.clientCAFile, anonymous off), and the apiserver
// presents one (--kubelet-client-certificate). The kubelets listen on the
// machine's address, so nothing else on the network may talk to them.
//
// The other direction needs nothing here: the kubelets reach the apiserver
// with a kubeconfig from testenv, whose CA signs their client certificates.
type kubeletPKI struct {
	CAFile, ClientCertFile, ClientKeyFile string
}

func writeKubeletPKI(dir string) (kubeletPKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return kubeletPKI{}, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return kubeletPKI{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "meshvol-sandbox-kubelet-client-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return kubeletPKI{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return kubeletPKI{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return kubeletPKI{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		// The kubelets authorize AlwaysAllow: the name only shows in logs.
		Subject:     pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return kubeletPKI{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return kubeletPKI{}, err
	}
	p := kubeletPKI{
		CAFile:         filepath.Join(dir, "kubelet-client-ca.crt"),
		ClientCertFile: filepath.Join(dir, "apiserver-kubelet-client.crt"),
		ClientKeyFile:  filepath.Join(dir, "apiserver-kubelet-client.key"),
	}
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{
		{p.CAFile, "CERTIFICATE", caDER},
		{p.ClientCertFile, "CERTIFICATE", der},
		{p.ClientKeyFile, "EC PRIVATE KEY", keyDER},
	} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			return kubeletPKI{}, fmt.Errorf("kubecluster: %w", err)
		}
	}
	return p, nil
}
