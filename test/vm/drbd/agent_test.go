//go:build vmtest

package drbd_test

import (
	"context"
	"encoding/gob"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// agent is the guest's half of the tier: this test binary, started by the
// guest's init with MESHVOL_VM_DRBD_AGENT=<node>, serves that node's
// drbd.ExecDriver — the production driver, with its own files, drbd-utils
// and the guest's kernel — to the tests on the host. It adds what a
// harness needs and a driver does not have: O_DIRECT IO on the DRBD device,
// holding the device open, and running a command for diagnosis.
type agent struct {
	node string
	d    *drbd.ExecDriver
	log  *slog.Logger
	stop chan struct{}
}

// runAgent serves until the host asks it to stop (POST /poweroff); the
// guest's init then powers the VM off.
func runAgent(node string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a := &agent{
		node: node,
		// NodeName as the node agent sets it; the guest's host name is the
		// node's name as well, as on the recorded machines.
		d:    drbd.NewExecDriver(drbd.ExecConfig{NodeName: node, Log: log}),
		log:  log,
		stop: make(chan struct{}),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /call", a.call)
	mux.HandleFunc("GET /events", a.events)
	mux.HandleFunc("POST /write", a.write)
	mux.HandleFunc("POST /read", a.read)
	mux.HandleFunc("GET /hold", a.hold)
	mux.HandleFunc("POST /exec", a.exec)
	a.productRoutes(mux)
	mux.HandleFunc("GET /ping", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, node) })
	mux.HandleFunc("POST /poweroff", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "bye")
		close(a.stop)
	})
	srv := &http.Server{Addr: ":" + strconv.Itoa(agentPort), Handler: mux}
	go func() {
		<-a.stop
		time.Sleep(200 * time.Millisecond) // let the answer leave
		srv.Close()
	}()
	log.Info("agent listening", "node", node, "port", agentPort)
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		log.Error("agent", "err", err)
		return 1
	}
	return 0
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/x-gob")
	if err := gob.NewEncoder(w).Encode(v); err != nil {
		// The host sees a broken answer and fails the call with this.
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func (a *agent) call(w http.ResponseWriter, r *http.Request) {
	var req callReq
	if err := gob.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	var resp callResp
	var err error
	switch req.Method {
	case "WriteConfig":
		err = a.d.WriteConfig(ctx, req.Res)
	case "RemoveConfig":
		err = a.d.RemoveConfig(ctx, req.Name)
	case "HasMetadata":
		resp.Bool, err = a.d.HasMetadata(ctx, req.Name)
	case "CreateMetadata":
		err = a.d.CreateMetadata(ctx, req.Name, req.MaxPeers)
	case "Up":
		err = a.d.Up(ctx, req.Name)
	case "Adjust":
		err = a.d.Adjust(ctx, req.Name)
	case "Down":
		err = a.d.Down(ctx, req.Name)
	case "Primary":
		err = a.d.Primary(ctx, req.Name, req.Force)
	case "Secondary":
		err = a.d.Secondary(ctx, req.Name)
	case "NewCurrentUUIDClearBitmap":
		err = a.d.NewCurrentUUIDClearBitmap(ctx, req.Name)
	case "Resize":
		err = a.d.Resize(ctx, req.Name)
	case "SuspendIO":
		err = a.d.SuspendIO(ctx, req.Name)
	case "ResumeIO":
		err = a.d.ResumeIO(ctx, req.Name)
	case "FailIOWithoutQuorum":
		err = a.d.FailIOWithoutQuorum(ctx, req.Name)
	case "RecomputeQuorum":
		err = a.d.RecomputeQuorum(ctx, req.Name, req.Quorum)
	case "ForgetPeer":
		err = a.d.ForgetPeer(ctx, req.Name, req.PeerNodeID)
	case "Reconnect":
		err = a.d.Reconnect(ctx, req.Name, req.PeerNodeID, req.Force)
	case "Verify":
		err = a.d.Verify(ctx, req.Name, req.PeerNodeID)
	case "Status":
		resp.Status, err = a.d.Status(ctx, req.Name)
	case "Show":
		resp.Show, err = a.d.Show(ctx, req.Name)
	case "DevicePath":
		resp.Text = a.d.DevicePath(req.Name)
	// Not Driver methods: what the node agent does on the node with the
	// driver, run here so that they see the guest's /proc.
	case "SafeDown":
		err = drbd.SafeDown(ctx, a.d, req.Name, nil)
	case "KernelHashAlgorithms":
		resp.Strings, err = drbd.KernelHashAlgorithms("")
	default:
		http.Error(w, "unknown method "+req.Method, http.StatusBadRequest)
		return
	}
	resp.Err = encodeErr(err)
	reply(w, resp)
}

// events streams the driver's events2 output. The request's context is the
// stream's: the host closing the connection stops drbdsetup. An error the
// stream ends with (drbdsetup failing) travels in a trailer.
func (a *agent) events(w http.ResponseWriter, r *http.Request) {
	rc, err := a.d.Events(r.Context())
	w.Header().Set("Trailer", errTrailer)
	if err != nil {
		w.Header().Set(errTrailer, trailerValue(err))
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	fl.Flush()
	buf := make([]byte, 32<<10)
	for {
		n, err := rc.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			fl.Flush()
		}
		if err != nil {
			if err != io.EOF && r.Context().Err() == nil {
				w.Header().Set(errTrailer, trailerValue(err))
			}
			return
		}
	}
}

// alignedBuf returns n bytes at a 4 KiB boundary, as O_DIRECT requires.
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & 4095)
	return b[off : off+n : off+n]
}

func (a *agent) device(r *http.Request) (path string, off int64, err error) {
	res := r.URL.Query().Get("res")
	if err := drbd.ValidateName(res); err != nil {
		return "", 0, fmt.Errorf("res %q: %w", res, err)
	}
	off, err = strconv.ParseInt(r.URL.Query().Get("off"), 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("off: %w", err)
	}
	return a.d.DevicePath(res), off, nil
}

// write writes the request body at ?off= on the resource's device with
// O_DIRECT: the call returns when DRBD has completed the write (protocol C:
// on every connected peer), and a write refused for lack of quorum fails
// with DRBD's EIO.
func (a *agent) write(w http.ResponseWriter, r *http.Request) {
	path, off, err := a.device(r)
	if err == nil {
		var data []byte
		if data, err = io.ReadAll(r.Body); err == nil {
			buf := alignedBuf(len(data))
			copy(buf, data)
			err = ioAt(path, os.O_WRONLY, func(f *os.File) error {
				_, err := f.WriteAt(buf, off)
				return err
			})
		}
	}
	reply(w, ioResp{Err: encodeErr(err)})
}

func (a *agent) read(w http.ResponseWriter, r *http.Request) {
	path, off, err := a.device(r)
	var buf []byte
	if err == nil {
		var n int
		if n, err = strconv.Atoi(r.URL.Query().Get("n")); err == nil {
			buf = alignedBuf(n)
			err = ioAt(path, os.O_RDONLY, func(f *os.File) error {
				_, err := f.ReadAt(buf, off)
				return err
			})
		}
	}
	reply(w, ioResp{Data: buf, Err: encodeErr(err)})
}

func ioAt(path string, flag int, fn func(*os.File) error) error {
	f, err := os.OpenFile(path, flag|syscall.O_DIRECT, 0)
	if err != nil {
		return err
	}
	err = fn(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// hold opens the resource's device (?mode=ro or rw) and keeps it open until
// the host closes the request: a mounted filesystem or a reader such as
// blkid, as DRBD sees them ("drbd0 opened by ...").
func (a *agent) hold(w http.ResponseWriter, r *http.Request) {
	res := r.URL.Query().Get("res")
	flag := os.O_RDONLY
	if r.URL.Query().Get("mode") == "rw" {
		flag = os.O_RDWR
	}
	f, err := os.OpenFile(a.d.DevicePath(res), flag, 0)
	if err != nil {
		fmt.Fprintf(w, "error %s\n", trailerValue(err))
		return
	}
	defer f.Close()
	fmt.Fprintln(w, "held")
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

// exec runs a command on the guest (dmesg, drbdsetup show, ...) for the
// checks that need drbd-utils' own output, with the production executor.
func (a *agent) exec(w http.ResponseWriter, r *http.Request) {
	var argv []string
	if err := gob.NewDecoder(r.Body).Decode(&argv); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	res, err := drbd.OSExecutor{}.Run(ctx, argv, nil)
	reply(w, ioResp{Result: res, Err: encodeErr(err)})
}
