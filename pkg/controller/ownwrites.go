package controller

import (
	"sync"
	"time"
)

// ownWrites remembers, per object name, the resourceVersion the cache showed when this
// controller last wrote the object's status, until the cache shows a newer one. A
// reconcile that still reads the old version computes from what that write replaced,
// so it would write the same status again (an extra request) or, worse, a status
// derived from stale facts; it waits for the watch instead.
//
// Only sound for writes conditional on that resourceVersion: such a write either fails
// with a Conflict (nothing remembered) or changes the object, so a newer version
// always reaches the cache.
type ownWrites struct {
	before sync.Map // name → resourceVersion before the write
}

// wrote records a successful status write of name made from resourceVersion before.
func (w *ownWrites) wrote(name, before string) { w.before.Store(name, before) }

// behind reports whether the cache still shows name at the version this controller's
// last write replaced; once it shows another, the memory of that write is dropped.
func (w *ownWrites) behind(name, current string) bool {
	before, ok := w.before.Load(name)
	if !ok {
		return false
	}
	if before == current {
		return true
	}
	w.before.Delete(name)
	return false
}

// forget drops what is remembered of name (the object is gone).
func (w *ownWrites) forget(name string) { w.before.Delete(name) }

// statusTimes remembers, per object name, when this controller last wrote the object's
// status. It is kept here, not read from the object: the cache keeps no managedFields
// (CacheOptions), whose times said the same. A controller that has not written an
// object's status since it started knows no time for it (zero), and does not hold its
// first write back.
type statusTimes struct {
	at sync.Map // name → time.Time
}

// wrote records a status write of name at t.
func (s *statusTimes) wrote(name string, t time.Time) { s.at.Store(name, t) }

// last is when this controller last wrote name's status, zero if it has not.
func (s *statusTimes) last(name string) time.Time {
	t, _ := s.at.Load(name)
	at, _ := t.(time.Time)
	return at
}

// forget drops what is remembered of name (the object is gone).
func (s *statusTimes) forget(name string) { s.at.Delete(name) }
