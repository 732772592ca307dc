package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/meshvol/meshvol/internal/testenv"
	"github.com/meshvol/meshvol/pkg/crdschema"
)

func TestControllerHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"controller", "--help"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	for _, flag := range []string{"-agent-grace-period", "-taint-lost-nodes", "-delete-lost-pods", "-leader-elect", "-metrics-bind-address",
		"-health-probe-bind-address", "-port-range", "-minor-range", "-hmac-algorithms", "-namespace", "-kubeconfig", "-kube-api-qps", "-kube-api-burst"} {
		if !strings.Contains(out.String(), flag) {
			t.Errorf("--help does not explain %s", flag)
		}
	}
}

func TestControllerBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--port-range", "9-2"}, {"--port-range", "x"}, {"--hmac-algorithms", "crc32"}, {"--agent-grace-period", "-1s"}, {"extra"},
		{"--kube-api-qps", "0"}, {"--kube-api-burst", "0"},
	} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"controller"}, args...), &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
		if errb.Len() == 0 {
			t.Errorf("%v: no explanation", args)
		}
	}
}

// writeKubeconfig writes cfg as a kubeconfig file.
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "x"
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestControllerUnreachableAPIServer(t *testing.T) {
	addr := refusingAddress(t)
	kc := writeKubeconfig(t, &rest.Config{Host: "https://" + addr})
	var out, errb bytes.Buffer
	code := runController(context.Background(), []string{"--kubeconfig", kc, "--start-timeout", "1s"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "cannot reach the apiserver at https://"+addr) {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}

// Against a real apiserver: without the CRDs the controller refuses to start and says
// what to install; on a CRD that lacks a field of this version's (one helm upgrade left
// alone) it refuses at once, naming the CRD, the field and the command that applies this
// version's; with this tree's CRDs it starts, becomes ready, and stops cleanly.
func TestControllerStartsAgainstAPIServer(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{CRDDirs: []string{}})
	kc := writeKubeconfig(t, env.Config)
	var out, errb bytes.Buffer
	code := runController(context.Background(), []string{"--kubeconfig", kc, "--start-timeout", "1s"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "install meshvol's CRDs first") {
		t.Fatalf("without CRDs: exit %d, stderr %q", code, errb.String())
	}

	dirs, err := testenv.DefaultCRDDirs()
	if err != nil {
		t.Fatal(err)
	}
	installed, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{Paths: dirs, Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	rvr := crdschema.Name("replicatedvolumereplicas")
	editCRD := func(edit func(*apiextensionsv1.CustomResourceDefinitionSpec)) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := &apiextensionsv1.CustomResourceDefinition{}
			if err := env.Client.Get(context.Background(), client.ObjectKey{Name: rvr}, cur); err != nil {
				return err
			}
			edit(&cur.Spec)
			return env.Client.Update(context.Background(), cur)
		}); err != nil {
			t.Fatal(err)
		}
	}
	var built *apiextensionsv1.CustomResourceDefinitionSpec
	for _, c := range installed {
		if c.Name == rvr {
			built = c.Spec.DeepCopy()
		}
	}
	editCRD(func(spec *apiextensionsv1.CustomResourceDefinitionSpec) {
		delete(spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"].Properties, "peers")
	})
	errb.Reset()
	began := time.Now()
	code = runController(context.Background(), []string{"--kubeconfig", kc, "--start-timeout", "30s"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "CustomResourceDefinition "+rvr+" (v1alpha1) lacks status.peers;") ||
		!strings.Contains(errb.String(), crdschema.Fix) {
		t.Fatalf("on an RVR CRD without status.peers: exit %d, stderr %q", code, errb.String())
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("the refusal took %s: a stale CRD is final, not tried again until --start-timeout", took)
	}
	editCRD(func(spec *apiextensionsv1.CustomResourceDefinitionSpec) { *spec = *built })

	probe := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	errb.Reset()
	go func() {
		done <- runController(ctx, []string{"--kubeconfig", kc, "--namespace", "default", "--metrics-bind-address", "0",
			"--health-probe-bind-address", probe, "--leader-elect=true"}, &out, &errb)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + probe + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready: %v; stderr %s", err, tail(errb.String()))
		}
		select {
		case code := <-done:
			t.Fatalf("exited %d before it was ready: %s", code, tail(errb.String()))
		case <-time.After(100 * time.Millisecond):
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d after a clean stop: %s", code, tail(errb.String()))
	}
}

// refusingAddress is a loopback address where nothing listens and nothing
// can start to while the test runs: a socket bound there (without
// SO_REUSEADDR, so no other bind succeeds) that never listens, so a connect
// is refused. A port found free and released could be taken by another
// process on the machine before the test connects.
func refusingAddress(t *testing.T) string {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*unix.SockaddrInet4).Port))
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func tail(s string) string {
	if len(s) > 2000 {
		return "…" + s[len(s)-2000:]
	}
	return s
}
