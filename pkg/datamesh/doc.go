// Package datamesh is the engine that decides every change of a volume's datamesh — who
// is a member, of which type, under which q and qmr, who is attached — and moves it one
// confirmed step at a time. docs/datamesh.md describes it rule by rule;
// docs/datamesh-spec.md is the specification it implements (states, paths,
// confirmation groups, preconditions); docs/layouts.md derives the layouts, q, qmr and
// the guards (package layout); docs/modelcheck.md says how the model checker
// (package modelcheck) explores it.
//
// # The contract of Process
//
//	eng := datamesh.NewEngine(nil, datamesh.Features{}) // nil: DefaultRegistry()
//	res, err := eng.Process(&datamesh.Input{RV: work, RSC: rsc, RVRs: rvrs, RVAs: rvas, Pool: pool, Now: now})
//
// Inputs (Input) are everything one reconcile of one volume knows: the volume, its
// storage class, its replicas (RVRs) and attachment requests (RVAs), including those
// being deleted, the storage pool's eligible nodes, the time, and what the caller has
// decided about lost nodes (ForceLeave, ForceDetach) or asks of quorum (ChangeQuorum).
// The controller's AgentReady condition on each RVR says whether the rest of that RVR's
// status is current (docs/datamesh.md "Guards").
//
// Outputs are two:
//   - RV.Status, mutated in place: the configuration, the published datamesh (members,
//     q, qmr, attachments, multiattach), status.datameshRevision, the transitions in
//     flight with their steps, the replica requests with their messages, the effective
//     layout. The caller deep-copies the volume first if it needs the original, and
//     writes the status when Result.Changed.
//   - Result: Changed (the status differs from what came in), Revision, Waiting,
//     Wanted (replica objects placement should create, delete or retype, additions
//     first), Attachments (one verdict per RVA, in input order, for the RVA's status)
//     and Events (for a person). Its slices are the caller's.
//
// Bad input (a nil RV, RVR or RVA, a ChangeQuorum outside 1..32, a status.configuration
// that breaks the layout rules) is an error naming the field and the rule; the status
// is then untouched.
//
// Purity. Process performs no I/O, imports no client, starts no goroutine and reads no
// clock: Input.Now is the only time, and it only stamps startedAt/completedAt. The
// Engine keeps nothing between calls (its registry and features are read-only), so one
// Engine may serve every worker at once.
//
// Determinism. The same input gives the same status and Result, whatever the order of
// the RVRs (maps are used for lookups only, never iterated into the output; replicas are
// visited in name order, and members and requests are kept in name order). A controller
// restarted between two reconciles decides exactly what it would have decided.
//
// How transitions persist and resume. Everything the engine needs to go on is in the
// status: each transition names its plan by ID and version (the Registry keeps old
// versions, so a transition started under one keeps its steps after an upgrade) and
// records, per step, its status and the datameshRevision that published it; a replica
// confirms a step by reporting that revision (docs/datamesh.md "Confirmation"). One
// published change is one revision. The replica requests carry what each replica asks
// and how far it got. So Process is level-based: each call confirms what the replicas
// report (the backward pass), then starts what may start now (the forward passes), and
// calling it again on the same objects resumes exactly (testdata/scenarios/versions.txt).
//
// # One call, pass by pass
//
// Process builds a reconcile value for the call (the input, the status, the resolved
// configuration, the replicas in name order; members and replicas are found by name
// with a scan, so no index has to follow the member list), then runs the passes
// docs/datamesh.md "One Process call" lists:
// resolveConfiguration, syncRequests (which reports whether requests are open and
// whether one is a ForceLeave), backward, then formation — or, on a formed volume,
// emergency, changeQuorum (which reports whether a ChangeQuorum waits), membership,
// attachment (which returns the RVA verdicts and the Access replicas it wants) and
// settleLayout (which returns the replicas the layout wants). Each pass writes the
// status and returns what the later passes and the Result need; the call itself
// collects only the events and whether something waits.
//
// Where the rules are. Plans are derived from a few rules, not listed (plan.go,
// docs/datamesh.md "Plans are derived, not listed"); who confirms a step is waitSet
// (transitions.go, "Confirmation"); guards are layout's and membership.go's ("Guards");
// what may run beside what is membership.go and attach.go ("Parallelism"); q, qmr and
// the effective layout are layout's ("q, qmr and the effective layout"); formation is
// formation.go ("Formation"); force removal and lost nodes are emergency.go ("Replacing
// a lost node"); the layout diff is settle.go ("Configuration → replicas").
package datamesh
