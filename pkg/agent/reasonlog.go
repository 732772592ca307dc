package agent

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// reasonLog remembers, per replica, the last reason logged for something
// retried every RetryInterval, so that the log says each reason once. An
// entry goes when its reason clears or its replica is deleted (forget); the
// UID tells a replica re-created under the same name from the one logged.
type reasonLog struct {
	mu   sync.Mutex
	last map[string]loggedReason
}

type loggedReason struct {
	uid types.UID
	why string
}

func newReasonLog() *reasonLog { return &reasonLog{last: map[string]loggedReason{}} }

// changed records why as rvr's current reason ("" for none) and reports
// whether it is one to log: not empty, and not the one logged last for
// this replica.
func (l *reasonLog) changed(rvr *v1.ReplicatedVolumeReplica, why string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	last, had := l.last[rvr.Name]
	if why == "" {
		delete(l.last, rvr.Name)
		return false
	}
	l.last[rvr.Name] = loggedReason{uid: rvr.UID, why: why}
	return !had || last.why != why || last.uid != rvr.UID
}

// forget drops what was logged for a deleted replica.
func (l *reasonLog) forget(name string) {
	l.mu.Lock()
	delete(l.last, name)
	l.mu.Unlock()
}
