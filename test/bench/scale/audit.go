package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// auditPolicy records every request but reads, once each, with its metadata
// (who, what, the answer's code): the apiserver's own count of the writes,
// independent of the counters in meshvol's processes.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  verbs: ["get", "list", "watch"]
- level: Metadata
`

// Who made a request, as the audit log tells them apart: the controller runs as
// its own user; the agents and the benchmark share the control plane's admin
// certificate, and the benchmark's own requests carry loadUserAgent.
const (
	controllerUser = "meshvol-controller"
	loadUserAgent  = "meshvol-bench-scale-load"
)

// auditCounts is the audit log's tally of writes by component ("controller",
// "agent", "load") and, for each, how many were Lease renewals.
type auditCounts struct {
	Writes map[string]int
	Leases map[string]int
	// ByResource counts each component's writes by verb and resource, e.g.
	// "controller patch replicatedvolumes/status".
	ByResource map[string]int
}

type auditEvent struct {
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	User      struct {
		Username string `json:"username"`
	} `json:"user"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
}

// readAudit tallies the audit log at path.
func readAudit(path string) (auditCounts, error) {
	c := auditCounts{Writes: map[string]int{}, Leases: map[string]int{}, ByResource: map[string]int{}}
	f, err := os.Open(path)
	if err != nil {
		return c, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e auditEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.ObjectRef == nil {
			continue // a request to a non-resource path (/healthz)
		}
		switch e.Verb {
		case "get", "list", "watch":
			continue
		}
		who := "agent"
		switch {
		case e.User.Username == controllerUser:
			who = "controller"
		case strings.HasPrefix(e.UserAgent, loadUserAgent):
			who = "load"
		case strings.HasPrefix(e.User.Username, "system:"):
			// The control plane's own (the apiserver's identity Lease):
			// neither meshvol's nor the benchmark's.
			who = "system"
		}
		c.Writes[who]++
		res := e.ObjectRef.Resource
		if e.ObjectRef.Subresource != "" {
			res += "/" + e.ObjectRef.Subresource
		}
		if res == "leases" {
			c.Leases[who]++
		}
		key := who + " " + e.Verb + " " + res
		if e.ResponseStatus != nil && e.ResponseStatus.Code >= 300 {
			// A refused write (a conflict above all) is a round trip spent for nothing.
			key += fmt.Sprintf(" (refused: %d)", e.ResponseStatus.Code)
		}
		c.ByResource[key]++
	}
	return c, sc.Err()
}

// since is what grew from before to c.
func (c auditCounts) since(before auditCounts) auditCounts {
	d := auditCounts{Writes: map[string]int{}, Leases: map[string]int{}, ByResource: map[string]int{}}
	for k, v := range c.Writes {
		d.Writes[k] = v - before.Writes[k]
	}
	for k, v := range c.Leases {
		d.Leases[k] = v - before.Leases[k]
	}
	for k, v := range c.ByResource {
		if n := v - before.ByResource[k]; n > 0 {
			d.ByResource[k] = n
		}
	}
	return d
}
