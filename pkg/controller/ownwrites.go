package controller

import "sync"

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
