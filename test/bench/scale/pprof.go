package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"time"
)

// profiler records where a formation's time goes, in the three processes: this
// one's CPU profile, the apiserver's CPU in chunks (its /debug/pprof/, through
// the admin client), and the controller's from its /debug/pprof/ endpoint
// (`meshvol controller --pprof-bind-address`) in CPU chunks of chunk, with
// a goroutine profile after each chunk (where its workers wait: a rate limiter,
// the apiserver, a lock) and the block and mutex profiles at the end. Files go
// to dir as profile-TAG-{bench,apiserver-NN,controller-NN,goroutines-NN,block,mutex}.pprof;
// `go tool pprof -top bin/meshvol DIR/profile-TAG-controller-*.pprof` merges the
// chunks.
type profiler struct {
	dir, tag string
	addr     string // the controller's pprof address
	chunk    time.Duration
	// api reaches the apiserver's /debug/pprof/ at apiURL.
	api    *http.Client
	apiURL string

	stopSelf func()
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

func startProfiler(dir, tag, addr string, api *http.Client, apiURL string, chunk time.Duration) *profiler {
	p := &profiler{dir: dir, tag: tag, addr: addr, chunk: chunk, api: api, apiURL: apiURL}
	p.stopSelf = profile(p.path("bench"))
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	secs := int(p.chunk / time.Second)
	if addr != "" {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				p.fetch(ctx, http.DefaultClient, "http://"+p.addr, fmt.Sprintf("profile?seconds=%d", secs), p.path(fmt.Sprintf("controller-%02d", i)))
				p.fetch(context.Background(), http.DefaultClient, "http://"+p.addr, "goroutine", p.path(fmt.Sprintf("goroutines-%02d", i)))
			}
		}()
	}
	if api != nil {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				p.fetch(ctx, p.api, p.apiURL, fmt.Sprintf("profile?seconds=%d", secs), p.path(fmt.Sprintf("apiserver-%02d", i)))
			}
		}()
	}
	return p
}

func (p *profiler) path(what string) string {
	return filepath.Join(p.dir, "profile-"+p.tag+"-"+what+".pprof")
}

// fetch saves one profile from base; a failure leaves no file (a CPU chunk
// cut short by the end of formation is worth nothing).
func (p *profiler) fetch(ctx context.Context, hc *http.Client, base, what, path string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/debug/pprof/"+what, nil)
	if err != nil {
		return
	}
	resp, err := hc.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil || len(data) == 0 {
		return
	}
	_ = os.WriteFile(path, data, 0o644)
}

// stop ends the profiles and writes this process's block and mutex profiles
// and the controller's.
func (p *profiler) stop() {
	p.stopSelf()
	p.cancel()
	p.wg.Wait()
	for _, what := range []string{"block", "mutex"} {
		if f, err := os.Create(p.path("bench-" + what)); err == nil {
			_ = pprof.Lookup(what).WriteTo(f, 0)
			f.Close()
		}
		if p.addr != "" {
			p.fetch(context.Background(), http.DefaultClient, "http://"+p.addr, what, p.path("controller-"+what))
		}
	}
}

func init() {
	// The agents' and the simulator's queues and locks, for the block and
	// mutex profiles of a formation (a sample in about every 10 µs blocked,
	// one contended lock in 100).
	runtime.SetBlockProfileRate(10_000)
	runtime.SetMutexProfileFraction(100)
}
