package drbd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// ShowResource is one element of `drbdsetup show --json`: the configuration
// the kernel is really running (what `adjust` converged to), as opposed to
// the file on disk. Option sections are kept as key → value maps because
// show prints only options that differ from the defaults.
type ShowResource struct {
	Resource    string           `json:"resource"`
	Options     ShowOptions      `json:"options,omitempty"`
	ThisHost    ShowThisHost     `json:"_this_host"`
	Connections []ShowConnection `json:"connections,omitempty"`
}

type ShowThisHost struct {
	NodeID  int          `json:"node-id"`
	Volumes []ShowVolume `json:"volumes,omitempty"`
}

type ShowVolume struct {
	VolumeNr    int         `json:"volume_nr"`
	DeviceMinor int         `json:"device_minor"`
	BackingDisk string      `json:"backing-disk,omitempty"`
	MetaDisk    string      `json:"meta-disk,omitempty"`
	Disk        ShowDiskRef `json:"disk,omitempty"`
}

// ShowDiskRef is the "disk" key of a this-host volume: the string "none" for
// a diskless volume, or an object of disk options.
type ShowDiskRef struct {
	None    bool
	Options ShowOptions
}

func (d *ShowDiskRef) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		if s != "none" {
			return fmt.Errorf("volume disk: unexpected string %q (want \"none\" or an object)", s)
		}
		d.None = true
		return nil
	}
	return json.Unmarshal(b, &d.Options)
}

type ShowConnection struct {
	PeerNodeID int                  `json:"_peer_node_id"`
	Path       *ShowPath            `json:"path,omitempty"`
	Paths      []ShowPath           `json:"paths,omitempty"`
	Net        ShowOptions          `json:"net,omitempty"`
	Volumes    []ShowPeerDeviceConf `json:"volumes,omitempty"`
}

// AllPaths returns the connection's paths whether drbdsetup printed one
// ("path") or several ("paths").
func (c ShowConnection) AllPaths() []ShowPath {
	if c.Path != nil {
		return append([]ShowPath{*c.Path}, c.Paths...)
	}
	return c.Paths
}

// Name is the connection name (the peer's host name) from net._name.
func (c ShowConnection) Name() string { return c.Net["_name"] }

type ShowPath struct {
	ThisHost   string `json:"_this_host"`   // "ipv4 10.99.0.1:7000"
	RemoteHost string `json:"_remote_host"` // "ipv4 10.99.0.2:7000"
}

type ShowPeerDeviceConf struct {
	VolumeNr int         `json:"volume_nr"`
	Disk     ShowOptions `json:"disk,omitempty"`
}

// ShowOptions is an option section. Values are normalised to strings
// (drbdsetup prints booleans as JSON true/false and most others as strings);
// booleans become "yes"/"no" as in drbd.conf.
type ShowOptions map[string]string

func (o *ShowOptions) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	out := make(ShowOptions, len(raw))
	for k, v := range raw {
		var s string
		var f bool
		var n json.Number
		switch {
		case json.Unmarshal(v, &s) == nil:
			out[k] = s
		case json.Unmarshal(v, &f) == nil:
			if f {
				out[k] = "yes"
			} else {
				out[k] = "no"
			}
		case json.Unmarshal(v, &n) == nil:
			out[k] = n.String()
		default:
			val := strconv.Quote(string(v))
			if secretKeys[k] {
				val = Redacted
			}
			return fmt.Errorf("option %q: value %s is not a string, number or boolean", k, val)
		}
	}
	*o = out
	return nil
}

// secretKeys are the option keys whose values never leave the agent.
var secretKeys = map[string]bool{"shared-secret": true}

// Secret returns an option's value even when it is a secret: the only way
// to read one (String, %v, %#v, JSON and slog all print Redacted).
func (o ShowOptions) Secret(key string) string { return o[key] }

// redacted is o with every secret value replaced by Redacted.
func (o ShowOptions) redacted() map[string]string {
	out := make(map[string]string, len(o))
	for k, v := range o {
		if secretKeys[k] {
			v = Redacted
		}
		out[k] = v
	}
	return out
}

// String prints the options in key order with secrets redacted.
// `drbdsetup show --json` prints the shared secret in clear, and show
// output is exactly what ends up in a debug log or an error message; so
// every way of printing ShowOptions (String, GoString, MarshalJSON,
// LogValue) redacts, and only Secret reads one.
func (o ShowOptions) String() string {
	r := o.redacted()
	var b strings.Builder
	b.WriteString("map[")
	for i, k := range slices.Sorted(maps.Keys(r)) {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k + ":" + r[k])
	}
	b.WriteByte(']')
	return b.String()
}

// GoString makes %#v redact too.
func (o ShowOptions) GoString() string { return "drbd.ShowOptions" + o.String() }

// MarshalJSON writes the options with secrets redacted (see String).
func (o ShowOptions) MarshalJSON() ([]byte, error) { return json.Marshal(o.redacted()) }

// LogValue makes slog print the options redacted, whichever handler.
func (o ShowOptions) LogValue() slog.Value { return slog.StringValue(o.String()) }

// ParseShowJSON parses the output of `drbdsetup show --json`.
func ParseShowJSON(data []byte) ([]ShowResource, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, nil
	}
	var out []ShowResource
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("parse drbdsetup show --json: %w", err)
	}
	for i, r := range out {
		if r.Resource == "" {
			return nil, fmt.Errorf("parse drbdsetup show --json: resource #%d has no name", i)
		}
	}
	return out, nil
}
