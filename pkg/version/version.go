// Package version holds the build's identity, set by the linker:
//
//	go build -ldflags "-X github.com/meshvol/meshvol/pkg/version.Version=v0.1.0 -X github.com/meshvol/meshvol/pkg/version.Commit=abc123"
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

var (
	// Version is the release, e.g. v0.1.0; "dev" for a build without -ldflags.
	Version = "dev"
	// Commit is the git commit of the build; read from the Go build info when not set.
	Commit = ""
)

// Info is the identity of the running binary.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// Get returns the identity of the running binary.
func Get() Info {
	commit := Commit
	if commit == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					commit = s.Value
				}
			}
		}
	}
	if commit == "" {
		commit = "unknown"
	}
	return Info{
		Version:   Version,
		Commit:    commit,
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// String renders the identity on one line.
func (i Info) String() string {
	return fmt.Sprintf("meshvol %s (commit %s, %s, %s)", i.Version, i.Commit, i.GoVersion, i.Platform)
}
