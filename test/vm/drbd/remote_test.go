//go:build vmtest

package drbd_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// remote is one guest seen from the host: a drbd.Driver whose every method
// runs in the guest's ExecDriver (agent_test.go), plus the agent's IO and
// diagnosis requests.
type remote struct {
	node string
	base string // http://10.99.0.x:7999
	hc   *http.Client
}

var _ drbd.Driver = (*remote)(nil)

func newRemote(node, ip string) *remote {
	return &remote{node: node, base: "http://" + ip + ":" + strconv.Itoa(agentPort), hc: &http.Client{}}
}

func (r *remote) post(ctx context.Context, path string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+path, body)
	if err != nil {
		return err
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s: agent: %w", r.node, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: agent: %s: %s", r.node, resp.Status, strings.TrimSpace(string(msg)))
	}
	if err := gob.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s: agent answer: %w", r.node, err)
	}
	return nil
}

func (r *remote) call(ctx context.Context, req callReq) (callResp, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(req); err != nil {
		return callResp{}, err
	}
	var resp callResp
	if err := r.post(ctx, "/call", &b, &resp); err != nil {
		return resp, err
	}
	return resp, decodeErr(resp.Err)
}

func (r *remote) simple(ctx context.Context, req callReq) error {
	_, err := r.call(ctx, req)
	return err
}

func (r *remote) WriteConfig(ctx context.Context, res *drbd.Resource) error {
	return r.simple(ctx, callReq{Method: "WriteConfig", Res: res})
}

func (r *remote) RemoveConfig(ctx context.Context, name string) error {
	return r.simple(ctx, callReq{Method: "RemoveConfig", Name: name})
}

func (r *remote) HasMetadata(ctx context.Context, name string) (bool, error) {
	resp, err := r.call(ctx, callReq{Method: "HasMetadata", Name: name})
	return resp.Bool, err
}

func (r *remote) CreateMetadata(ctx context.Context, name string, maxPeers int) error {
	return r.simple(ctx, callReq{Method: "CreateMetadata", Name: name, MaxPeers: maxPeers})
}

func (r *remote) Up(ctx context.Context, name string) error {
	return r.simple(ctx, callReq{Method: "Up", Name: name})
}

func (r *remote) Adjust(ctx context.Context, name string) error {
	return r.simple(ctx, callReq{Method: "Adjust", Name: name})
}

func (r *remote) Down(ctx context.Context, name string) error {
	return r.simple(ctx, callReq{Method: "Down", Name: name})
}

func (r *remote) Primary(ctx context.Context, name string, force drbd.ForceReason) error {
	return r.simple(ctx, callReq{Method: "Primary", Name: name, Force: force})
}

func (r *remote) Secondary(ctx context.Context, name string) error {
	return r.simple(ctx, callReq{Method: "Secondary", Name: name})
}

func (r *remote) NewCurrentUUIDClearBitmap(ctx context.Context, name string) error {
	return r.simple(ctx, callReq{Method: "NewCurrentUUIDClearBitmap", Name: name})
}

func (r *remote) Resize(ctx context.Context, name string) error {
	return r.simple(ctx, callReq{Method: "Resize", Name: name})
}

func (r *remote) SuspendIO(ctx context.Context, name string) error {
	return r.simple(ctx, callReq{Method: "SuspendIO", Name: name})
}

func (r *remote) ResumeIO(ctx context.Context, name string) error {
	return r.simple(ctx, callReq{Method: "ResumeIO", Name: name})
}

func (r *remote) FailIOWithoutQuorum(ctx context.Context, name string) error {
	return r.simple(ctx, callReq{Method: "FailIOWithoutQuorum", Name: name})
}

func (r *remote) RecomputeQuorum(ctx context.Context, name string, q drbd.Quorum) error {
	return r.simple(ctx, callReq{Method: "RecomputeQuorum", Name: name, Quorum: q})
}

func (r *remote) ForgetPeer(ctx context.Context, name string, peerNodeID int) error {
	return r.simple(ctx, callReq{Method: "ForgetPeer", Name: name, PeerNodeID: peerNodeID})
}

func (r *remote) Reconnect(ctx context.Context, name string, peerNodeID int, force drbd.ForceReason) error {
	return r.simple(ctx, callReq{Method: "Reconnect", Name: name, PeerNodeID: peerNodeID, Force: force})
}

func (r *remote) Verify(ctx context.Context, name string, peerNodeID int) error {
	return r.simple(ctx, callReq{Method: "Verify", Name: name, PeerNodeID: peerNodeID})
}

func (r *remote) Status(ctx context.Context, name string) ([]drbd.StatusResource, error) {
	resp, err := r.call(ctx, callReq{Method: "Status", Name: name})
	return resp.Status, err
}

func (r *remote) Show(ctx context.Context, name string) ([]drbd.ShowResource, error) {
	resp, err := r.call(ctx, callReq{Method: "Show", Name: name})
	return resp.Show, err
}

// DevicePath asks the guest's driver. The interface has no context and no
// error; a guest that does not answer in a minute is a broken run.
func (r *remote) DevicePath(name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := r.call(ctx, callReq{Method: "DevicePath", Name: name})
	if err != nil {
		panic(fmt.Sprintf("%s: DevicePath(%q): %v", r.node, name, err))
	}
	return resp.Text
}

// SafeDown runs drbd.SafeDown in the guest, where it can see who holds the
// device open.
func (r *remote) SafeDown(ctx context.Context, name string) error {
	return r.simple(ctx, callReq{Method: "SafeDown", Name: name})
}

// KernelHashAlgorithms is drbd.KernelHashAlgorithms on the guest.
func (r *remote) KernelHashAlgorithms(ctx context.Context) ([]string, error) {
	resp, err := r.call(ctx, callReq{Method: "KernelHashAlgorithms"})
	return resp.Strings, err
}

// Events is the guest driver's events2 stream. Closing it (or ending ctx)
// ends the request, which ends drbdsetup in the guest.
func (r *remote) Events(ctx context.Context) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base+"/events", nil)
	if err != nil {
		return nil, err
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: agent: %w", r.node, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: agent: events: %s", r.node, resp.Status)
	}
	if err := trailerErr(resp.Trailer.Get(errTrailer)); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return &eventStream{resp: resp}, nil
}

// eventStream ends with the guest stream's error when it had one, as the
// driver's own stream does.
type eventStream struct{ resp *http.Response }

func (s *eventStream) Read(p []byte) (int, error) {
	n, err := s.resp.Body.Read(p)
	if err == io.EOF {
		if terr := trailerErr(s.resp.Trailer.Get(errTrailer)); terr != nil {
			return n, terr
		}
	}
	return n, err
}

func (s *eventStream) Close() error { return s.resp.Body.Close() }

func ioQuery(res string, off int64, n int) string {
	q := url.Values{"res": {res}, "off": {strconv.FormatInt(off, 10)}}
	if n >= 0 {
		q.Set("n", strconv.Itoa(n))
	}
	return q.Encode()
}

// Write writes data at off through the guest's DRBD device (O_DIRECT).
func (r *remote) Write(ctx context.Context, res string, off int64, data []byte) error {
	var resp ioResp
	if err := r.post(ctx, "/write?"+ioQuery(res, off, -1), bytes.NewReader(data), &resp); err != nil {
		return err
	}
	if err := decodeErr(resp.Err); err != nil {
		return fmt.Errorf("%s: write %d bytes at %d: %w", r.node, len(data), off, err)
	}
	return nil
}

// Read reads n bytes at off through the guest's DRBD device (O_DIRECT).
func (r *remote) Read(ctx context.Context, res string, off int64, n int) ([]byte, error) {
	var resp ioResp
	if err := r.post(ctx, "/read?"+ioQuery(res, off, n), nil, &resp); err != nil {
		return nil, err
	}
	if err := decodeErr(resp.Err); err != nil {
		return nil, fmt.Errorf("%s: read %d bytes at %d: %w", r.node, n, off, err)
	}
	return resp.Data, nil
}

// Hold opens the guest's device read-only (rw false) or read-write and
// keeps it open until release is called.
func (r *remote) Hold(ctx context.Context, res string, rw bool) (release func(), err error) {
	mode := "ro"
	if rw {
		mode = "rw"
	}
	ctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base+"/hold?"+url.Values{"res": {res}, "mode": {mode}}.Encode(), nil)
	if err != nil {
		cancel()
		return nil, err
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("%s: agent: %w", r.node, err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "held\n" {
		resp.Body.Close()
		cancel()
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "error "); ok {
			return nil, fmt.Errorf("%s: open %s %s: %w", r.node, res, mode, trailerErr(v))
		}
		return nil, fmt.Errorf("%s: hold %s: %q %v", r.node, res, line, err)
	}
	return func() {
		cancel()
		resp.Body.Close()
	}, nil
}

// Exec runs argv on the guest.
func (r *remote) Exec(ctx context.Context, argv ...string) (drbd.Result, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(argv); err != nil {
		return drbd.Result{}, err
	}
	var resp ioResp
	if err := r.post(ctx, "/exec", &b, &resp); err != nil {
		return drbd.Result{}, err
	}
	return resp.Result, decodeErr(resp.Err)
}

// Ping reports whether the agent answers.
func (r *remote) Ping(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base+"/ping", nil)
	if err != nil {
		return err
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// Poweroff ends the agent; the guest's init powers the VM off.
func (r *remote) Poweroff(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/poweroff", nil)
	if err != nil {
		return err
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}
