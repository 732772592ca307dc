package drbd

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// StatusResource is one element of `drbdsetup status --json --verbose
// --statistics` (drbd-utils 9.22). Field names follow the JSON keys; see
// internal/captures/testdata/*status-json*.json.
type StatusResource struct {
	Name             string `json:"name"`
	NodeID           int    `json:"node-id"`
	Role             string `json:"role"`
	Suspended        bool   `json:"suspended"`
	SuspendedUser    bool   `json:"suspended-user"`
	SuspendedNoData  bool   `json:"suspended-no-data"`
	SuspendedFencing bool   `json:"suspended-fencing"`
	SuspendedQuorum  bool   `json:"suspended-quorum"`
	ForceIOFailures  bool   `json:"force-io-failures"`
	WriteOrdering    string `json:"write-ordering"`

	Devices     []StatusDevice     `json:"devices"`
	Connections []StatusConnection `json:"connections"`
}

// StatusDevice is a volume of a StatusResource. Size and the IO counters are
// in KiB, as drbdsetup prints them.
type StatusDevice struct {
	Volume       int    `json:"volume"`
	Minor        int    `json:"minor"`
	DiskState    string `json:"disk-state"`
	Client       bool   `json:"client"`
	Quorum       bool   `json:"quorum"`
	Open         *bool  `json:"open,omitempty"` // newer drbd-utils only
	Size         int64  `json:"size"`
	Read         int64  `json:"read"`
	Written      int64  `json:"written"`
	ALWrites     int64  `json:"al-writes"`
	BMWrites     int64  `json:"bm-writes"`
	UpperPending int64  `json:"upper-pending"`
	LowerPending int64  `json:"lower-pending"`
}

// StatusConnection is a connection of a StatusResource.
type StatusConnection struct {
	PeerNodeID      int                `json:"peer-node-id"`
	Name            string             `json:"name"`
	ConnectionState string             `json:"connection-state"`
	Congested       bool               `json:"congested"`
	PeerRole        string             `json:"peer-role"`
	APInFlight      int64              `json:"ap-in-flight"`
	RSInFlight      int64              `json:"rs-in-flight"`
	PeerDevices     []StatusPeerDevice `json:"peer_devices"`
}

// StatusPeerDevice is the state of one volume towards one peer. The rs-* and
// ov-* figures are present only while a resync or online verify runs
// (HasSyncDetails / HasOnlineVerifyDetails).
type StatusPeerDevice struct {
	Volume                 int     `json:"volume"`
	ReplicationState       string  `json:"replication-state"`
	PeerDiskState          string  `json:"peer-disk-state"`
	PeerClient             bool    `json:"peer-client"`
	ResyncSuspended        string  `json:"resync-suspended"` // "no", or reasons such as "dependency", "user", "peer"
	Received               int64   `json:"received"`
	Sent                   int64   `json:"sent"`
	OutOfSync              int64   `json:"out-of-sync"` // KiB
	Pending                int64   `json:"pending"`
	Unacked                int64   `json:"unacked"`
	HasSyncDetails         bool    `json:"has-sync-details"`
	HasOnlineVerifyDetails bool    `json:"has-online-verify-details"`
	PercentInSync          float64 `json:"percent-in-sync"`

	RSTotal                  int64    `json:"rs-total,omitempty"` // sectors
	RSDtStartMs              int64    `json:"rs-dt-start-ms,omitempty"`
	RSPausedMs               int64    `json:"rs-paused-ms,omitempty"`
	RSDt0Ms                  int64    `json:"rs-dt0-ms,omitempty"`
	RSDb0Sectors             int64    `json:"rs-db0-sectors,omitempty"`
	RSDt1Ms                  int64    `json:"rs-dt1-ms,omitempty"`
	RSDb1Sectors             int64    `json:"rs-db1-sectors,omitempty"`
	RSFailed                 int64    `json:"rs-failed,omitempty"`
	RSSameCsum               int64    `json:"rs-same-csum,omitempty"`
	Want                     *float64 `json:"want,omitempty"`
	Db0Dt0MiBs               *float64 `json:"db0/dt0 [MiB/s],omitempty"`
	Db1Dt1MiBs               *float64 `json:"db1/dt1 [MiB/s],omitempty"`
	EstimatedSecondsToFinish *int64   `json:"estimated-seconds-to-finish,omitempty"`
	DbDtMiBs                 *float64 `json:"db/dt [MiB/s],omitempty"`
	PercentResyncDone        *float64 `json:"percent-resync-done,omitempty"`

	OVStartSector     *int64   `json:"ov-start-sector,omitempty"`
	OVStopSector      *int64   `json:"ov-stop-sector,omitempty"`
	OVPosition        *int64   `json:"ov-position,omitempty"`
	OVLeft            *int64   `json:"ov-left,omitempty"`
	OVSkipped         *int64   `json:"ov-skipped,omitempty"`
	PercentVerifyDone *float64 `json:"percent-verify-done,omitempty"`
}

// ParseStatusJSON parses the output of `drbdsetup status --json`. Empty
// output (no resources configured) is an empty list, not an error.
func ParseStatusJSON(data []byte) ([]StatusResource, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, nil
	}
	var out []StatusResource
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("parse drbdsetup status --json: %w", err)
	}
	for i, r := range out {
		if r.Name == "" {
			return nil, fmt.Errorf("parse drbdsetup status --json: resource #%d has no name", i)
		}
	}
	return out, nil
}
