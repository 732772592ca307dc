// Package modelcheck is the datamesh engine's model checker: it drives the
// real engine (pkg/datamesh, Engine.Process) through every order of events
// within a bound — replicas confirming steps one by one, agents restarting,
// a node being lost and force-removed, requests arriving (add, remove,
// retype, attach, detach, configuration changes) — and checks after every
// state that no two sides of a network cut can both write, that q and qmr
// never fall below what the effective layout requires, that a normal
// transition never gives up redundancy, that at most one node is Primary,
// and that every transition completes once every replica confirms.
//
// The world (World) is the volume's status as the engine wrote it plus,
// per replica, the datamesh snapshot its DRBD has applied: while a step is
// half confirmed replicas disagree about q, qmr and the voter set, and the
// partition analysis (partition.go) counts each replica with its own. DRBD's
// quorum decision is pkg/drbd/quorum.Compute, called in one place.
//
// FuzzInput turns bytes into schema-valid engine inputs for the fuzz target.
//
// docs/modelcheck.md states every invariant exactly, the modelling choices
// and why they are sound, and the recorded figures.
package modelcheck
