package soak_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The workload: a separate process (this test binary, re-executed) writes through the
// filesystem on a volume's device. A thread of the test process blocked on a
// simulated device would keep the process from exiting (pkg/drbd/drbdsim's doc,
// "Block device"); a child can be abandoned.
//
// It writes sequence numbers into slotCount files, each replaced atomically: write a
// temporary file, fsync it, rename it over the slot, fsync the directory, then print
// "ack <slot> <seq>" — the write is acknowledged once that line is out. A slot must
// afterwards hold its last acknowledged sequence number or a later one (a write in
// flight at a crash may or may not have landed), never an earlier one, and its
// content must be exactly what that number writes.

const (
	slotCount = 48
	slotSize  = 8 << 10
)

// slotContent is the file content for sequence number seq.
func slotContent(seq int64) []byte {
	b := make([]byte, slotSize)
	h := fmt.Sprintf("seq %d\n", seq)
	copy(b, h)
	for i := len(h); i < len(b); i++ {
		b[i] = byte(seq*31 + int64(i))
	}
	return b
}

// readSlot returns the sequence number a slot file holds, checking the content.
func readSlot(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var seq int64
	if _, err := fmt.Sscanf(string(b), "seq %d\n", &seq); err != nil {
		return 0, fmt.Errorf("%s: no sequence header (%d bytes)", path, len(b))
	}
	if !bytes.Equal(b, slotContent(seq)) {
		return seq, fmt.Errorf("%s: content is not what seq %d writes", path, seq)
	}
	return seq, nil
}

// writerMain is the child: it writes until SIGTERM or the first error.
func writerMain(dir string) int {
	seq, _ := strconv.ParseInt(os.Getenv("MESHVOL_SOAK_SEQ"), 10, 64)
	var stop atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	go func() { <-sig; stop.Store(true) }()
	d, err := os.Open(dir)
	if err != nil {
		fmt.Printf("err %v\n", err)
		return 1
	}
	for !stop.Load() {
		seq++
		slot := int(seq % slotCount)
		if err := writeSlot(d, dir, slot, seq); err != nil {
			fmt.Printf("err seq %d: %v\n", seq, err)
			return 1
		}
		fmt.Printf("ack %d %d\n", slot, seq)
		time.Sleep(15 * time.Millisecond)
	}
	return 0
}

func writeSlot(d *os.File, dir string, slot int, seq int64) error {
	tmp := filepath.Join(dir, fmt.Sprintf("s%d.tmp", slot))
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(slotContent(seq)); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, fmt.Sprintf("s%d", slot))); err != nil {
		return err
	}
	return d.Sync()
}

// writer is the parent's handle on one child.
type writer struct {
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	last string // the child's last error line
}

// startWriter runs a child on dir from sequence number seq on; every acknowledged
// write goes to ack.
func startWriter(dir string, seq int64, ack func(slot int, seq int64)) (*writer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), writerEnv+"="+dir, fmt.Sprintf("MESHVOL_SOAK_SEQ=%d", seq))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &writer{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var slot int
			var s int64
			if _, err := fmt.Sscanf(sc.Text(), "ack %d %d", &slot, &s); err == nil {
				ack(slot, s)
				continue
			}
			w.mu.Lock()
			w.last = sc.Text()
			w.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	return w, nil
}

// exited reports whether the child is gone (it stops at its first error).
func (w *writer) exited() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

func (w *writer) lastError() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// stop asks the child to finish its write and exit; a child blocked in the kernel (IO
// suspended without quorum) is killed and abandoned after d. It reports whether the
// child exited.
func (w *writer) stop(d time.Duration) bool {
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
		return true
	case <-time.After(d):
	}
	_ = w.cmd.Process.Kill()
	select {
	case <-w.done:
		return true
	case <-time.After(2 * time.Second):
		return false
	}
}
