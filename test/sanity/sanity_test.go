package sanity_test

import (
	"context"
	"flag"
	"net"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	csisanity "github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"
	"google.golang.org/grpc"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/meshvol/meshvol/test/sanity"
)

var layoutsFlag = flag.String("sanity.layouts", "1d,2d-1tb,3d", "the layouts to run, comma-separated (1d, 2d-1tb, 3d)")

// layoutResult is what one layout's run gave.
type layoutResult struct {
	passed, failed, skipped, pending int
	time                             time.Duration
	skips                            map[string]string // spec → the reason it gave
	rpcs                             string
}

// TestSanity runs csi-test's pkg/sanity (v5.4.0) in process, once per layout, against
// the controller service and node-1's node service of one in-process cluster (real
// kube-apiserver and etcd, the controller, three agents on drbdsim with loop
// devices; real mkfs and mount). Every applicable spec must pass; the only specs
// allowed to skip are those of capabilities meshvol does not advertise.
func TestSanity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("sanity needs root: drbdsim's loop devices, mkfs and mount")
	}
	if testing.Short() {
		t.Skip("-short: the sanity suite takes minutes")
	}
	// The cluster's components log through controller-runtime's logger; a failing
	// spec's message names the RPC's error, which is what one reads first.
	ctrllog.SetLogger(logr.Discard())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	h, err := sanity.Start(ctx, sanity.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(); err != nil {
			t.Errorf("stopping the harness: %v", err)
		}
	})
	t.Logf("cluster up in %v", time.Since(start).Round(time.Millisecond))

	var layouts []sanity.Layout
	for _, name := range strings.Split(*layoutsFlag, ",") {
		l, ok := sanity.LayoutByName(name)
		if !ok {
			t.Fatalf("-sanity.layouts: unknown layout %q", name)
		}
		layouts = append(layouts, l)
	}
	results := map[string]*layoutResult{}
	current := "" // the layout whose specs run now
	for _, l := range layouts {
		target, staging, err := h.Paths(l)
		if err != nil {
			t.Fatal(err)
		}
		cfg := csisanity.NewTestConfig()
		// A deadline on every call, as the sidecars set one: a call that waits for a
		// volume state that never comes fails the spec in minutes instead of holding
		// the suite for pkg/csi's five-minute default.
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithUnaryInterceptor(callTimeout), grpc.WithContextDialer(dialUnix))
		cfg.ControllerDialOptions = append(cfg.ControllerDialOptions, grpc.WithUnaryInterceptor(callTimeout), grpc.WithContextDialer(dialUnix))
		cfg.Address = unixAddress(h.NodeEndpoint)
		cfg.ControllerAddress = unixAddress(h.ControllerEndpoint)
		cfg.TargetPath, cfg.StagingPath = target, staging
		cfg.TestVolumeParameters = l.Parameters()
		cfg.TestVolumeSize, cfg.TestVolumeExpandSize = sanity.VolumeSize, sanity.ExpandSize
		// Run the attach-limit spec too: it then skips only because meshvol sets no
		// max_volumes_per_node, which is what it should say.
		cfg.TestNodeVolumeAttachLimit = true
		res := &layoutResult{skips: map[string]string{}}
		results[l.Name] = res
		var began time.Time
		ginkgo.Describe(l.Name, func() {
			ginkgo.BeforeEach(func() {
				if current != l.Name {
					current, began = l.Name, time.Now()
					h.RPCs.Reset()
				}
			})
			csisanity.GinkgoTest(&cfg)
			// Defined last, so it runs after the layout's specs (Ginkgo keeps the order
			// inside a top-level container).
			ginkgo.It(leftoversSpec, func() {
				res.time = time.Since(began)
				res.rpcs = h.RPCs.Table()
				left, err := h.Leftovers(context.Background())
				gomega.Expect(err).NotTo(gomega.HaveOccurred())
				gomega.Expect(left).To(gomega.BeEmpty(), "csi-sanity's clean-up (ControllerUnpublishVolume, DeleteVolume) left these behind")
				gomega.Expect(h.Err()).NotTo(gomega.HaveOccurred())
			})
		})
	}
	ginkgo.ReportAfterEach(func(r ginkgo.SpecReport) {
		if len(r.ContainerHierarchyTexts) == 0 {
			return
		}
		res := results[r.ContainerHierarchyTexts[0]]
		if res == nil || r.LeafNodeText == leftoversSpec {
			return
		}
		name := strings.Join(append(r.ContainerHierarchyTexts[1:], r.LeafNodeText), " ")
		switch r.State {
		case types.SpecStatePassed:
			res.passed++
		case types.SpecStateSkipped:
			if r.Failure.Message == "" {
				return // not run: filtered out by -ginkgo.focus or -ginkgo.skip
			}
			res.skipped++
			res.skips[name] = r.Failure.Message
		case types.SpecStatePending:
			res.pending++ // marked pending in csi-test itself
		default:
			res.failed++
		}
	})

	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, rep := ginkgo.GinkgoConfiguration()
	suite.Timeout = 50 * time.Minute
	rep.NoColor = true // make test keeps the log in a file
	ginkgo.RunSpecs(t, "csi-sanity", suite, rep)

	for _, l := range layouts {
		res := results[l.Name]
		t.Logf("layout %s: %d passed, %d failed, %d skipped, %d pending in csi-test in %v",
			l.Name, res.passed, res.failed, res.skipped, res.pending, res.time.Round(time.Second))
		var names []string
		for n := range res.skips {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			t.Logf("  skipped: %s: %s", n, res.skips[n])
		}
		if res.passed == 0 && res.failed == 0 {
			continue // filtered out
		}
		if res.rpcs != "" {
			t.Logf("layout %s, CSI calls by slowest call:\n%s", l.Name, res.rpcs)
		}
		for _, n := range names {
			if !sanity.AllowedSkip(res.skips[n]) {
				t.Errorf("layout %s: spec %q skipped (%s): only specs of capabilities meshvol does not advertise may skip", l.Name, n, res.skips[n])
			}
		}
	}
}

// leftoversSpec is the spec each layout ends with.
const leftoversSpec = "leaves no volume or attachment behind"

// unixAddress is a socket's address for csi-test, and dialUnix its dialer.
//
// csi-test v5.4.0's utils.Connect reads the channel's state only after grpc.Dial has
// returned, then waits for that state to change: a unix socket that is Ready before
// that first read leaves it waiting a minute for a change that never comes
// ("Connection timed out"; v5.6.0 reads the state first). A "passthrough" address
// keeps Connect from installing its own unix dialer, and dialUnix waits a moment
// before connecting, so the channel is still Connecting when Connect looks.
func unixAddress(endpoint string) string {
	return "passthrough:///" + strings.TrimPrefix(endpoint, "unix://")
}

func dialUnix(ctx context.Context, path string) (net.Conn, error) {
	select {
	case <-time.After(200 * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return (&net.Dialer{}).DialContext(ctx, "unix", path)
}

// callTimeout bounds each CSI call to two minutes.
func callTimeout(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return invoker(ctx, method, req, reply, cc, opts...)
}
