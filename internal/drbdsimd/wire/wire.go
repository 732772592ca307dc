// Package wire is the protocol between the drbd-utils stand-ins
// (internal/drbdsimd/drbdutils) and the drbdsim service (internal/drbdsimd):
// one connection per command. The stand-in sends a Request as one JSON
// line; the service answers with frames — stdout and stderr bytes as the
// command prints them, then its exit code — so a long-running command
// (events2) streams, and closing the connection is the stand-in being
// killed.
package wire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
)

// Request is one command line as the stand-in was run.
type Request struct {
	// Argv is the command line; Argv[0] is the program's base name
	// (drbdadm, drbdsetup or drbdmeta).
	Argv []string `json:"argv"`
	// Node is $__DRBD_NODE__, drbdadm's override of the host name; empty
	// when unset.
	Node string `json:"node,omitempty"`
	// Files are the configuration files the command names (drbdadm -c),
	// read by the stand-in: they live in its mount namespace, not the
	// service's.
	Files map[string]string `json:"files,omitempty"`
}

// Frame kinds.
const (
	Stdout byte = 'o'
	Stderr byte = 'e'
	Exit   byte = 'x' // payload: the exit code as 4 bytes, big-endian
)

// maxFrame bounds one frame's payload: status of many resources fits, a
// corrupt length does not allocate gigabytes.
const maxFrame = 64 << 20

// WriteFrame writes one frame.
func WriteFrame(w io.Writer, kind byte, payload []byte) error {
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// WriteExit writes the exit frame.
func WriteExit(w io.Writer, code int) error {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(int32(code)))
	return WriteFrame(w, Exit, b[:])
}

// ReadFrame reads one frame.
func ReadFrame(r io.Reader) (kind byte, payload []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("wire: frame of %d bytes exceeds %d", n, maxFrame)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	switch hdr[0] {
	case Stdout, Stderr:
	case Exit:
		if n != 4 {
			return 0, nil, fmt.Errorf("wire: exit frame of %d bytes", n)
		}
	default:
		return 0, nil, fmt.Errorf("wire: unknown frame kind %q", hdr[0])
	}
	return hdr[0], payload, nil
}

// ExitCode decodes an exit frame's payload.
func ExitCode(payload []byte) int { return int(int32(binary.BigEndian.Uint32(payload))) }

// WriteRequest sends the request line.
func WriteRequest(w io.Writer, req Request) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
