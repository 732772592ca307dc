package agent

// ReleaseFinalizer is releaseFinalizer, for the tests of its two ways against a real
// apiserver.
var ReleaseFinalizer = releaseFinalizer
