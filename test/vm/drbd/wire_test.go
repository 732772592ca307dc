//go:build vmtest

package drbd_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/gob"
	"errors"
	"syscall"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// The guests' agents and the host's tests speak HTTP on the private network
// of the tier's network namespace. Requests and answers are gob, not JSON:
// gob copies pkg/drbd's structs field by field, whereas their JSON methods
// read drbdsetup's format (a ShowResource would not survive a JSON round
// trip).

// agentPort is where each guest's agent listens (on its 10.99.0.x).
const agentPort = 7999

// callReq is one drbd.Driver method call: Method is the method's name, the
// other fields its arguments.
type callReq struct {
	Method     string
	Name       string
	Res        *drbd.Resource
	Force      drbd.ForceReason
	MaxPeers   int
	PeerNodeID int
	Quorum     drbd.Quorum
}

// callResp is a method's result.
type callResp struct {
	Bool    bool
	Text    string
	Strings []string
	Status  []drbd.StatusResource
	Show    []drbd.ShowResource
	Err     *wireError
}

// ioResp answers the agent's own requests (IO on the device, commands).
type ioResp struct {
	Data   []byte
	Result drbd.Result
	Err    *wireError
}

// wireError is an error of the guest's driver, carried so that errors.Is and
// errors.As give on the host what they gave in the guest: the message, the
// *drbd.CommandError if there is one, every drbd sentinel the error matches,
// and a syscall.Errno (EIO of a write without quorum).
type wireError struct {
	Msg   string
	Cmd   *wireCmd
	Kinds []string
	Errno int
}

type wireCmd struct {
	Args      []string
	ExitCode  int
	Stderr    string
	StateCode int
	Kind      string
	Err       string
}

// sentinels are the errors a wireError names. A sentinel added to pkg/drbd
// must be added here, or errors.Is on the host will not see it.
var sentinels = []struct {
	name string
	err  error
}{
	{"ErrNoQuorum", drbd.ErrNoQuorum},
	{"ErrNoUpToDateData", drbd.ErrNoUpToDateData},
	{"ErrTwoPrimaries", drbd.ErrTwoPrimaries},
	{"ErrDeviceInUse", drbd.ErrDeviceInUse},
	{"ErrStateChangeRefused", drbd.ErrStateChangeRefused},
	{"ErrUnknownResource", drbd.ErrUnknownResource},
	{"ErrNoMetadata", drbd.ErrNoMetadata},
	{"ErrTimeout", drbd.ErrTimeout},
	{"ErrInvalidConfig", drbd.ErrInvalidConfig},
	{"ErrCommandFailed", drbd.ErrCommandFailed},
	{"context.DeadlineExceeded", context.DeadlineExceeded},
	{"context.Canceled", context.Canceled},
}

func sentinelName(err error) string {
	for _, s := range sentinels {
		if s.err == err {
			return s.name
		}
	}
	return ""
}

func sentinelByName(name string) error {
	for _, s := range sentinels {
		if s.name == name {
			return s.err
		}
	}
	return nil
}

func encodeErr(err error) *wireError {
	if err == nil {
		return nil
	}
	w := &wireError{Msg: err.Error()}
	var ce *drbd.CommandError
	if errors.As(err, &ce) {
		w.Cmd = &wireCmd{Args: ce.Args, ExitCode: ce.ExitCode, Stderr: ce.Stderr, StateCode: ce.StateCode, Kind: sentinelName(ce.Kind)}
		if ce.Err != nil {
			w.Cmd.Err = ce.Err.Error()
		}
	}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			w.Kinds = append(w.Kinds, s.name)
		}
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		w.Errno = int(errno)
	}
	return w
}

// remoteError is a guest's error on the host.
type remoteError struct {
	msg     string
	wrapped []error
}

func (e *remoteError) Error() string   { return e.msg }
func (e *remoteError) Unwrap() []error { return e.wrapped }

func decodeErr(w *wireError) error {
	if w == nil {
		return nil
	}
	e := &remoteError{msg: w.Msg}
	var kind error
	if c := w.Cmd; c != nil {
		kind = sentinelByName(c.Kind)
		ce := &drbd.CommandError{Args: c.Args, ExitCode: c.ExitCode, Stderr: c.Stderr, StateCode: c.StateCode, Kind: kind}
		if c.Err != "" {
			ce.Err = errors.New(c.Err)
		}
		e.wrapped = append(e.wrapped, ce)
	}
	for _, name := range w.Kinds {
		if s := sentinelByName(name); s != nil && s != kind {
			e.wrapped = append(e.wrapped, s)
		}
	}
	if w.Errno != 0 {
		e.wrapped = append(e.wrapped, syscall.Errno(w.Errno))
	}
	return e
}

// errTrailer is the HTTP trailer that carries the error a stream (events2)
// ended with, as base64 of a gob wireError.
const errTrailer = "X-Meshvol-Error"

func trailerValue(err error) string {
	var b bytes.Buffer
	if gob.NewEncoder(&b).Encode(encodeErr(err)) != nil {
		return ""
	}
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

func trailerErr(v string) error {
	if v == "" {
		return nil
	}
	raw, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return err
	}
	var w wireError
	if err := gob.NewDecoder(bytes.NewReader(raw)).Decode(&w); err != nil {
		return err
	}
	return decodeErr(&w)
}
