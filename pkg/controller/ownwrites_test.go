package controller

import "testing"

func TestOwnWritesWaitForTheCacheToShowTheWrite(t *testing.T) {
	var w ownWrites
	if w.behind("a", "10") {
		t.Fatal("behind with no write remembered")
	}
	w.wrote("a", "10")
	if !w.behind("a", "10") {
		t.Fatal("the cache still shows the version the write replaced: want behind")
	}
	if w.behind("b", "10") {
		t.Fatal("another object's write made b behind")
	}
	if w.behind("a", "11") {
		t.Fatal("the cache shows a newer version: want not behind")
	}
	// Once a newer version was seen, the memory is gone: an object recreated under an
	// old version string (etcd never reuses one, but a test apiserver may restart) is
	// not held back.
	if w.behind("a", "10") {
		t.Fatal("the memory of the write outlived the cache catching up")
	}
	w.wrote("a", "12")
	w.forget("a")
	if w.behind("a", "12") {
		t.Fatal("forget kept the memory")
	}
}
