package datamesh

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPlans runs testdata/plans/*: each `plan` command derives one path of docs/datamesh-spec.md's
// tables; the expected output is the specification's path, then every step with its q/qmr change
// and its confirmation group (∪ voters when the step changes q).
func TestPlans(t *testing.T) {
	datadriven.Walk(t, "testdata/plans", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "plan":
				return runPlan(t, d)
			case "confirm":
				var from, to string
				d.ScanArgs(t, "from", &from)
				d.ScanArgs(t, "to", &to)
				f, ok1 := ParseState(from)
				tt, ok2 := ParseState(to)
				if !ok1 || !ok2 {
					t.Fatalf("bad states %q %q", from, to)
				}
				return ConfirmGroupOf(f, tt).String()
			}
			t.Fatalf("unknown command %q", d.Cmd)
			return ""
		})
	})
}

func runPlan(t *testing.T, d *datadriven.TestData) string {
	var from, to string
	d.ScanArgs(t, "from", &from)
	d.ScanArgs(t, "to", &to)
	f, ok1 := ParseState(from)
	tt, ok2 := ParseState(to)
	if !ok1 || !ok2 {
		t.Fatalf("bad states %q %q", from, to)
	}
	var p PathParams
	if d.HasArg("voters") {
		var v string
		d.ScanArgs(t, "voters", &v)
		p.VotersOdd = v == "odd"
	}
	if d.HasArg("shadow") {
		d.ScanArgs(t, "shadow", &p.Shadow)
	}
	if d.HasArg("qmr") {
		var v string
		d.ScanArgs(t, "qmr", &v)
		p.QMRUp, p.QMRDown = v == "up", v == "down"
	}
	p.Force = d.HasArg("force")
	if d.HasArg("tb") {
		d.ScanArgs(t, "tb", &p.TBHold)
	}
	pl, err := DerivePlan(f, tt, p)
	if err != nil {
		return "error: " + err.Error()
	}
	if _, ok := DefaultRegistry().Lookup(pl.ID, 1); !ok {
		t.Fatalf("plan %s not in the default registry", pl.ID)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", pl.Path())
	fmt.Fprintf(&b, "plan %s: %s, %s\n", pl.ID, pl.Type, pl.Group)
	for i, s := range pl.Steps {
		c := s.Confirm.String()
		if (s.Q != NoChange || s.HoldQ) && s.Confirm != ConfirmVoters {
			c += " ∪ voters"
		}
		if s.Force {
			c += " − dead"
		}
		fmt.Fprintf(&b, "%d. %-14s confirm=%s\n", i+1, s.Name, c)
	}
	return b.String()
}

// ---- scenarios ----

type world struct {
	eng      *Engine
	rv       *v1.ReplicatedVolume
	rvrs     []*v1.ReplicatedVolumeReplica
	rvas     []*v1.ReplicatedVolumeAttachment
	pool     *Pool
	now      time.Time
	force    []string
	fdetach  []string
	cq       *QuorumChange
	last     Result
	features Features
	reg      *Registry
	rsc      *v1.ReplicatedStorageClass
	extraFTT int
	// published is every datamesh the engine published, by revision: what a replica
	// that reports revision N runs (checkPrimaries).
	published map[int64]attachSnapshot
	lost      map[string]bool // replicas named in ForceLeave/ForceDetach: their node is gone
}

// attachSnapshot is what of a published datamesh decides who may be Primary.
type attachSnapshot struct {
	attached map[string]bool
	multi    bool
}

func newWorld() *world {
	w := &world{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), published: map[int64]attachSnapshot{}, lost: map[string]bool{}}
	w.pool = &Pool{Name: "pool", Available: true}
	for i := 1; i <= 9; i++ {
		w.pool.Nodes = append(w.pool.Nodes, v1.EligibleNode{NodeName: "n" + strconv.Itoa(i), Zone: "z" + strconv.Itoa((i-1)%3+1), Ready: true})
	}
	w.rv = &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: "vol"}}
	w.rv.Spec.ConfigurationMode = v1.ConfigurationModeManual
	w.rv.Spec.ManualConfiguration = &v1.ReplicatedVolumeConfiguration{StoragePool: "pool", Topology: v1.TopologyIgnored, VolumeAccess: v1.VolumeAccessPreferablyLocal}
	w.reg = DefaultRegistry()
	return w
}

func (w *world) rvr(name string) *v1.ReplicatedVolumeReplica {
	for _, r := range w.rvrs {
		if r.Name == name {
			return r
		}
	}
	return nil
}

func (w *world) process(t testing.TB) (Result, error) {
	if w.eng == nil {
		w.eng = NewEngine(w.reg, w.features)
	}
	w.now = w.now.Add(time.Second)
	res, err := w.processOnBoth(t)
	for _, n := range w.force {
		w.lost[n] = true
	}
	for _, n := range w.fdetach {
		w.lost[n] = true
	}
	w.force, w.fdetach, w.cq = nil, nil, nil
	w.recordPublished()
	w.checkPrimaries(t)
	w.last = res
	return res, err
}

// processOnBoth runs one reconcile of w on w.eng, and the same input on a fresh engine
// with a copy of the volume: a controller restarted before this reconcile must decide
// exactly the same (checkFreshEngine).
func (w *world) processOnBoth(t testing.TB) (Result, error) {
	in := &Input{RV: w.rv, RSC: w.rsc, RVRs: w.rvrs, RVAs: w.rvas, Pool: w.pool, Now: w.now,
		ForceLeave: w.force, ForceDetach: w.fdetach, ChangeQuorum: w.cq, ExtraFTT: w.extraFTT}
	full := *in
	full.RV = w.rv.DeepCopy()
	res, err := w.eng.Process(in)
	checkFreshEngine(t, w.reg, w.features, &full, w.rv, res, err)
	return res, err
}

// checkFreshEngine runs in (a copy of the volume the engine under test saw) through a
// new engine, and fails t if its status or result differ from got: the engine under
// test has served earlier calls, and nothing of them may show.
func checkFreshEngine(t testing.TB, reg *Registry, f Features, in *Input, gotRV *v1.ReplicatedVolume, got Result, gotErr error) {
	t.Helper()
	e := NewEngine(reg, f)
	before := in.RV.Status.DeepCopy()
	want, err := e.Process(in)
	if (err == nil) != (gotErr == nil) {
		t.Fatalf("fresh engine: error %v, engine under test: %v", err, gotErr)
	}
	if err == nil && want.Changed == equality.Semantic.DeepEqual(*before, in.RV.Status) {
		t.Fatalf("Result.Changed is %v, but the status before and after are semantically %s", want.Changed, map[bool]string{true: "equal", false: "different"}[!want.Changed])
	}
	if !reflect.DeepEqual(in.RV.Status, gotRV.Status) {
		t.Fatalf("fresh and reused engine disagree on the status:\nfresh: %+v\ngot:   %+v", in.RV.Status, gotRV.Status)
	}
	norm := func(r Result) Result {
		if len(r.Wanted) == 0 {
			r.Wanted = nil
		}
		if len(r.Attachments) == 0 {
			r.Attachments = nil
		}
		if len(r.Events) == 0 {
			r.Events = nil
		}
		return r
	}
	if !reflect.DeepEqual(norm(want), norm(got)) {
		t.Fatalf("fresh and reused engine disagree on the result:\nfresh: %+v\ngot:   %+v", want, got)
	}
}

func (w *world) addRVR(name, node string, typ v1.ReplicaType) {
	r := &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: name}}
	r.Spec = v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: "vol", NodeName: node, Type: typ}
	r.Status.Addresses = []string{"10.0.0." + strings.TrimPrefix(node, "n")}
	w.rvrs = append(w.rvrs, r)
}

func shortType(t v1.MemberType) string { return StateOfMember(t).String() }

func (w *world) status(verbose bool) string {
	st := &w.rv.Status
	var b strings.Builder
	eff := "-"
	if st.EffectiveLayout != nil {
		eff = fmt.Sprintf("FTT=%d,GMDR=%d", st.EffectiveLayout.FailuresToTolerate, st.EffectiveLayout.GuaranteedMinimumDataRedundancy)
	}
	cfg := "-"
	if c := st.Configuration; c != nil {
		cfg = fmt.Sprintf("FTT=%d,GMDR=%d", c.FailuresToTolerate, c.GuaranteedMinimumDataRedundancy)
	}
	fmt.Fprintf(&b, "revision %d, q=%d qmr=%d, effective %s, configured %s", st.DatameshRevision, st.Datamesh.Quorum, st.Datamesh.QuorumMinimumRedundancy, eff, cfg)
	if st.Datamesh.Multiattach {
		b.WriteString(", multiattach")
	}
	b.WriteString("\n")
	if len(st.Datamesh.Members) > 0 {
		b.WriteString("members:")
		for _, m := range st.Datamesh.Members {
			fmt.Fprintf(&b, " %s=%s#%d", m.Name, shortType(m.Type), m.NodeID)
			if m.Attached {
				b.WriteString("(attached)")
			}
		}
		b.WriteString("\n")
	}
	for _, t := range st.DatameshTransitions {
		fmt.Fprintf(&b, "transition %s", t.Type)
		if t.ReplicaName != "" {
			fmt.Fprintf(&b, " %s", t.ReplicaName)
		}
		fmt.Fprintf(&b, " [%s v%d, %s]\n", t.PlanID, t.PlanVersion, t.Group)
		for i, s := range t.Steps {
			fmt.Fprintf(&b, "  %d. %s: %s", i+1, s.Name, s.Status)
			if s.Status != v1.StepPending {
				fmt.Fprintf(&b, " @%d", s.DatameshRevision)
			}
			if s.Message != "" && s.Status != v1.StepCompleted {
				fmt.Fprintf(&b, " %q", s.Message)
			}
			b.WriteString("\n")
		}
	}
	if verbose {
		for _, r := range st.DatameshReplicaRequests {
			fmt.Fprintf(&b, "request %s %s", r.Name, r.Operation)
			if r.Type != "" {
				fmt.Fprintf(&b, " %s", r.Type)
			}
			fmt.Fprintf(&b, ": %q\n", r.Message)
		}
	}
	for _, x := range w.last.Wanted {
		fmt.Fprintf(&b, "wanted %s %s", x.Action, x.Type)
		if x.Replica != "" {
			fmt.Fprintf(&b, " %s", x.Replica)
		}
		if x.NodeName != "" {
			fmt.Fprintf(&b, " on %s", x.NodeName)
		}
		fmt.Fprintf(&b, ": %s\n", x.Reason)
	}
	for _, a := range w.last.Attachments {
		fmt.Fprintf(&b, "attachment %s %s: %q\n", a.Name, a.Phase, a.Message)
	}
	for _, e := range w.last.Events {
		fmt.Fprintf(&b, "event %s %s: %s\n", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// names returns the replica names in the command's positional args ("all" = every RVR).
func (w *world) names(d *datadriven.TestData) []string {
	var out []string
	for _, a := range d.CmdArgs {
		if len(a.Vals) > 0 {
			continue
		}
		if a.Key == "all" {
			for _, r := range w.rvrs {
				out = append(out, r.Name)
			}
			continue
		}
		out = append(out, a.Key)
	}
	return out
}

func argStr(t *testing.T, d *datadriven.TestData, key, def string) string {
	if !d.HasArg(key) {
		return def
	}
	var v string
	d.ScanArgs(t, key, &v)
	return v
}

func argInt(t *testing.T, d *datadriven.TestData, key string, def int) int {
	if !d.HasArg(key) {
		return def
	}
	var v int
	d.ScanArgs(t, key, &v)
	return v
}

// TestScenarios runs testdata/scenarios/*: build a volume, ask for changes, confirm
// revisions replica by replica, and print the status after each `process`.
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/scenarios", func(t *testing.T, path string) {
		w := newWorld()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return w.cmd(t, d)
		})
	})
}

func (w *world) cmd(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "volume":
		c := w.rv.Spec.ManualConfiguration
		c.FailuresToTolerate = int32(argInt(t, d, "ftt", 0))
		c.GuaranteedMinimumDataRedundancy = int32(argInt(t, d, "gmdr", 0))
		c.Topology = v1.Topology(argStr(t, d, "topology", string(c.Topology)))
		c.VolumeAccess = v1.VolumeAccess(argStr(t, d, "access", string(c.VolumeAccess)))
		w.rv.Spec.MaxAttachments = int32(argInt(t, d, "max-attachments", 1))
		if d.HasArg("zones") {
			c.Zones = strings.Split(argStr(t, d, "zones", ""), ",")
		}
		if d.HasArg("shadow") {
			w.features.ShadowDiskful = true
			w.eng = nil
		}
		return "ok"
	case "class":
		// class [replication=X] [ftt=N gmdr=M] [topology=T] [access=A]: Auto mode with a
		// ReplicatedStorageClass.
		w.rv.Spec.ConfigurationMode = v1.ConfigurationModeAuto
		w.rv.Spec.ManualConfiguration = nil
		w.rv.Spec.ReplicatedStorageClassName = "rsc"
		w.rsc = &v1.ReplicatedStorageClass{}
		w.rsc.Name = "rsc"
		w.rsc.Spec.StoragePool = "pool"
		if d.HasArg("replication") {
			r := v1.Replication(argStr(t, d, "replication", ""))
			w.rsc.Spec.Replication = &r
		}
		if d.HasArg("ftt") {
			f, g := int32(argInt(t, d, "ftt", 0)), int32(argInt(t, d, "gmdr", 0))
			w.rsc.Spec.FailuresToTolerate, w.rsc.Spec.GuaranteedMinimumDataRedundancy = &f, &g
		}
		w.rsc.Spec.Topology = v1.Topology(argStr(t, d, "topology", ""))
		w.rsc.Spec.VolumeAccess = v1.VolumeAccess(argStr(t, d, "access", ""))
		if d.HasArg("missing") {
			w.rsc = nil
		}
		return "ok"
	case "rv-deleting":
		ts := metav1.NewTime(w.now)
		w.rv.DeletionTimestamp = &ts
		return "ok"
	case "replica":
		for _, n := range w.names(d) {
			if n == "noaddr" {
				continue
			}
			w.addRVR(n, argStr(t, d, "node", "n"+strings.TrimLeft(n, "abcdefghijklmnopqrstuvwxyz")), v1.ReplicaType(argStr(t, d, "type", "Diskful")))
			if d.HasArg("noaddr") {
				w.rvr(n).Status.Addresses = nil
			}
		}
		return "ok"
	case "zone":
		node, zone := argStr(t, d, "node", ""), argStr(t, d, "zone", "")
		for i := range w.pool.Nodes {
			if w.pool.Nodes[i].NodeName == node {
				w.pool.Nodes[i].Zone = zone
			}
		}
		return "ok"
	case "process":
		if _, err := w.process(t); err != nil {
			return "error: " + err.Error()
		}
		return w.status(d.HasArg("requests"))
	case "confirm":
		for _, n := range w.names(d) {
			if r := w.rvr(n); r != nil {
				r.Status.DatameshRevision = w.rv.Status.DatameshRevision
			}
		}
		if d.HasArg("rev") {
			rev := int64(argInt(t, d, "rev", 0))
			for _, n := range w.names(d) {
				w.rvr(n).Status.DatameshRevision = rev
			}
		}
		w.checkPrimaries(t)
		return "ok"
	case "disk":
		// disk r1 state=Diskless: r1's agent reports its DRBD disk state (a disk that
		// failed and was detached reports Diskless).
		for _, n := range w.names(d) {
			w.rvr(n).Status.DiskState = v1.DiskState(argStr(t, d, "state", ""))
		}
		return "ok"
	case "uptodate", "outdated":
		ds := v1.DiskStateUpToDate
		if d.Cmd == "outdated" {
			ds = v1.DiskStateOutdated
		}
		for _, n := range w.names(d) {
			w.rvr(n).Status.DiskState = ds
		}
		return "ok"
	case "form":
		// form: create the configured layout's replicas (r1.. on n1..), then settle.
		if err := w.createReplicas(t); err != nil {
			return "error: " + err.Error()
		}
		return w.cmd(t, &datadriven.TestData{Cmd: "settle", CmdArgs: d.CmdArgs})
	case "place":
		// place: act as placement on Result.Wanted from the last process.
		return w.place()
	case "settle":
		// Every replica confirms every revision and every D is UpToDate, until nothing is
		// in flight; prints the steps that completed on the way.
		var b strings.Builder
		for i := 0; i < 64; i++ {
			for _, r := range w.rvrs {
				r.Status.DatameshRevision = w.rv.Status.DatameshRevision
				// A disk reaches UpToDate unless the scenario set its state.
				if (r.Spec.Type == v1.ReplicaTypeDiskful || r.Spec.Type == v1.ReplicaTypeShadowDiskful) && r.Status.DiskState == "" {
					r.Status.DiskState = v1.DiskStateUpToDate
				}
			}
			before := w.rv.Status.DatameshRevision
			if _, err := w.process(t); err != nil {
				return "error: " + err.Error()
			}
			if d.HasArg("trace") {
				for _, tr := range w.rv.Status.DatameshTransitions {
					for _, st := range tr.Steps {
						if st.Status == v1.StepActive && st.DatameshRevision > before {
							fmt.Fprintf(&b, "@%d %s %s: %s (q=%d qmr=%d)\n", st.DatameshRevision, tr.Type, tr.ReplicaName, st.Name,
								w.rv.Status.Datamesh.Quorum, w.rv.Status.Datamesh.QuorumMinimumRedundancy)
						}
					}
				}
			}
			for _, e := range w.last.Events {
				fmt.Fprintf(&b, "event %s %s: %s\n", e.Type, e.Reason, e.Message)
			}
			placed := ""
			if d.HasArg("place") {
				placed = w.place()
				b.WriteString(placed)
			}
			if len(w.rv.Status.DatameshTransitions) == 0 && before == w.rv.Status.DatameshRevision && placed == "" {
				break
			}
		}
		w.last.Events = nil
		return b.String() + w.status(d.HasArg("requests"))
	case "delete":
		for _, n := range w.names(d) {
			ts := metav1.NewTime(w.now)
			w.rvr(n).DeletionTimestamp = &ts
		}
		return "ok"
	case "gone":
		for _, n := range w.names(d) {
			for i, r := range w.rvrs {
				if r.Name == n {
					w.rvrs = append(w.rvrs[:i], w.rvrs[i+1:]...)
					break
				}
			}
		}
		return "ok"
	case "retype":
		for _, n := range w.names(d) {
			w.rvr(n).Spec.Type = v1.ReplicaType(argStr(t, d, "type", ""))
		}
		return "ok"
	case "attach":
		node := argStr(t, d, "node", "")
		a := &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "rva-" + node, CreationTimestamp: metav1.NewTime(w.now)}}
		a.Spec = v1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: "vol", NodeName: node}
		w.rvas = append(w.rvas, a)
		return "ok"
	case "detach":
		node := argStr(t, d, "node", "")
		for i, a := range w.rvas {
			if a.Spec.NodeName == node {
				w.rvas = append(w.rvas[:i], w.rvas[i+1:]...)
				break
			}
		}
		return "ok"
	case "force-leave":
		w.force = append(w.force, w.names(d)...)
		return "ok"
	case "force-detach":
		w.fdetach = append(w.fdetach, w.names(d)...)
		return "ok"
	case "override":
		// override q=N qmr=M reason="..." sets spec.quorumOverride; override none removes it.
		if d.HasArg("none") {
			w.rv.Spec.QuorumOverride = nil
			return "ok"
		}
		o := &v1.QuorumOverride{Reason: argStr(t, d, "reason", "test")}
		if d.HasArg("q") {
			q := int32(argInt(t, d, "q", 0))
			o.Quorum = &q
		}
		if d.HasArg("qmr") {
			q := int32(argInt(t, d, "qmr", 0))
			o.QuorumMinimumRedundancy = &q
		}
		w.rv.Spec.QuorumOverride = o
		return "ok"
	case "change-quorum":
		w.cq = &QuorumChange{Quorum: int32(argInt(t, d, "q", 0)), QuorumMinimumRedundancy: int32(argInt(t, d, "qmr", 0))}
		return "ok"
	case "connected":
		// connected from=r1 to=r3: r1 reports a Connected DRBD connection to r3.
		from, to := w.rvr(argStr(t, d, "from", "")), argStr(t, d, "to", "")
		state := argStr(t, d, "state", "Connected")
		for i := range from.Status.Peers {
			if from.Status.Peers[i].Name == to {
				from.Status.Peers[i].ConnectionState = state
				return "ok"
			}
		}
		ps := v1.PeerStatus{Name: to, ConnectionState: state}
		for _, m := range w.rv.Status.Datamesh.Members {
			if m.Name == to {
				id := m.NodeID
				ps.NodeID = &id
			}
		}
		from.Status.Peers = append(from.Status.Peers, ps)
		return "ok"
	case "condition":
		// condition r2 reason=ConfigurationFailed message="..."
		reason, msg := argStr(t, d, "reason", ""), argStr(t, d, "message", "")
		status := metav1.ConditionFalse
		if reason == v1.ReasonConfigured {
			status = metav1.ConditionTrue
		}
		if d.Input != "" {
			msg = strings.TrimSpace(d.Input)
		}
		w.setConditionOn(t, d, metav1.Condition{Type: v1.ConditionDRBDConfigured, Status: status, Reason: reason, Message: msg})
		return "ok"
	case "role":
		// role r1 role=Primary: r1's agent reports its DRBD role (a force-detached
		// member whose device stays open stays Primary).
		for _, n := range w.names(d) {
			w.rvr(n).Status.Role = v1.ReplicaRole(argStr(t, d, "role", ""))
		}
		return "ok"
	case "promote-refused":
		// promote-refused r1 (the message as input): r1's agent reports that DRBD
		// refused its promotion for want of quorum (DRBDRole=False, PromoteNoQuorum).
		// promote-refused r1 reason=PromoteFailed: refused for another reason ("(-2)
		// Need access to UpToDate data").
		msg := "Promotion refused: drbd: no quorum"
		if d.Input != "" {
			msg = strings.TrimSpace(d.Input)
		}
		reason := argStr(t, d, "reason", v1.ReasonPromoteNoQuorum)
		w.setConditionOn(t, d, metav1.Condition{Type: v1.ConditionDRBDRole, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
		return "ok"
	case "agent":
		// agent r2 ready=false [reason=LeaseExpired] [message="..."]: the controller's
		// AgentReady verdict on the replicas (docs/contract.md). ready=none removes it.
		ready := argStr(t, d, "ready", "true")
		c := metav1.Condition{Type: v1.ConditionAgentReady, Status: metav1.ConditionTrue,
			Reason: argStr(t, d, "reason", v1.ReasonAgentLeaseValid), Message: argStr(t, d, "message", "")}
		if ready == "false" {
			c.Status = metav1.ConditionFalse
			c.Reason = argStr(t, d, "reason", v1.ReasonAgentLeaseExpired)
		}
		for _, n := range w.names(d) {
			r := w.rvr(n)
			if r == nil {
				t.Fatalf("no replica %q", n)
			}
			if ready == "none" {
				r.Status.Conditions = slices.DeleteFunc(r.Status.Conditions, func(c metav1.Condition) bool { return c.Type == v1.ConditionAgentReady })
				continue
			}
			setCondition(r, c)
		}
		return "ok"
	case "pool":
		w.pool.Available = argStr(t, d, "available", "true") == "true"
		if node := argStr(t, d, "node-ready", ""); node != "" {
			parts := strings.SplitN(node, "=", 2)
			for i := range w.pool.Nodes {
				if w.pool.Nodes[i].NodeName == parts[0] {
					w.pool.Nodes[i].Ready = parts[1] == "true"
				}
			}
		}
		return "ok"
	case "set-status":
		// Directly set parts of the status (a volume formed by an older controller).
		if d.HasArg("effective") {
			v := strings.Split(argStr(t, d, "effective", ""), ",")
			f, _ := strconv.Atoi(v[0])
			g, _ := strconv.Atoi(v[1])
			w.rv.Status.EffectiveLayout = &v1.Layout{FailuresToTolerate: int32(f), GuaranteedMinimumDataRedundancy: int32(g)}
		}
		if d.HasArg("qmr") {
			w.rv.Status.Datamesh.QuorumMinimumRedundancy = int32(argInt(t, d, "qmr", 0))
		}
		return "ok"
	case "register":
		// register a new version of a plan with different steps (a controller upgrade).
		id := argStr(t, d, "id", "")
		old, ok := w.reg.Latest(id)
		if !ok {
			t.Fatalf("no plan %s", id)
		}
		np := *old
		np.Version = old.Version + 1
		np.Steps = append([]Step(nil), old.Steps...)
		if d.HasArg("drop-last") {
			np.Steps = np.Steps[:len(np.Steps)-1]
		}
		if err := w.reg.Register(np); err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("registered %s v%d: %s", np.ID, np.Version, np.Path())
	case "restart":
		// A controller restart: a fresh engine, the same objects.
		w.eng = nil
		return "ok"
	case "requests":
		var b strings.Builder
		for _, r := range w.rv.Status.DatameshReplicaRequests {
			fmt.Fprintf(&b, "%s %s %s: %q\n", r.Name, r.Operation, r.Type, r.Message)
		}
		return b.String()
	}
	t.Fatalf("unknown command %q", d.Cmd)
	return ""
}

// createReplicas runs the engine and creates the replicas it asks to place until it
// asks for none (the configured layout's replicas, r1.. on n1..), at most five rounds.
func (w *world) createReplicas(t testing.TB) error {
	for i := 0; i < 5; i++ {
		if _, err := w.process(t); err != nil {
			return err
		}
		if w.place() == "" {
			return nil
		}
	}
	return nil
}

// place realises the last Result.Wanted the way placement would: new replicas get the
// next free name r<N> on the lowest free node; deletions set the deletion timestamp;
// retypes change spec.type. Replicas whose deletion is done (not a member any more) are
// then removed from the world, as the finalizer would let them go.
func (w *world) place() string {
	var b strings.Builder
	for _, x := range w.last.Wanted {
		switch x.Action {
		case WantCreate:
			name := ""
			for i := 1; ; i++ {
				if w.rvr("r"+strconv.Itoa(i)) == nil {
					name = "r" + strconv.Itoa(i)
					break
				}
			}
			node := x.NodeName
			for i := 1; node == ""; i++ {
				n := "n" + strconv.Itoa(i)
				used := false
				for _, r := range w.rvrs {
					used = used || r.Spec.NodeName == n
				}
				if !used {
					node = n
				}
			}
			w.addRVR(name, node, x.Type)
			fmt.Fprintf(&b, "placement: create %s %s on %s\n", x.Type, name, node)
		case WantDelete:
			if r := w.rvr(x.Replica); r != nil && r.DeletionTimestamp == nil {
				ts := metav1.NewTime(w.now)
				r.DeletionTimestamp = &ts
				fmt.Fprintf(&b, "placement: delete %s\n", x.Replica)
			}
		case WantRetype:
			if r := w.rvr(x.Replica); r != nil && r.Spec.Type != x.Type {
				r.Spec.Type = x.Type
				fmt.Fprintf(&b, "placement: retype %s to %s\n", x.Replica, x.Type)
			}
		}
	}
	// Finalizer: a deleted replica that is no longer a member goes away.
	for i := 0; i < len(w.rvrs); i++ {
		r := w.rvrs[i]
		if r.DeletionTimestamp == nil {
			continue
		}
		member := false
		for _, m := range w.rv.Status.Datamesh.Members {
			member = member || m.Name == r.Name
		}
		inFlight := false
		for _, t := range w.rv.Status.DatameshTransitions {
			inFlight = inFlight || t.ReplicaName == r.Name
		}
		if !member && !inFlight {
			w.rvrs = append(w.rvrs[:i], w.rvrs[i+1:]...)
			i--
			fmt.Fprintf(&b, "placement: %s is gone\n", r.Name)
		}
	}
	return b.String()
}

// setCondition replaces the condition of c's type on r, or appends it: the agent's and
// the controller's conditions live side by side in one list keyed by type.
// setConditionOn sets c on every replica the directive names.
func (w *world) setConditionOn(t *testing.T, d *datadriven.TestData, c metav1.Condition) {
	t.Helper()
	for _, n := range w.names(d) {
		r := w.rvr(n)
		if r == nil {
			t.Fatalf("no replica %q", n)
		}
		setCondition(r, c)
	}
}

func setCondition(r *v1.ReplicatedVolumeReplica, c metav1.Condition) {
	for i := range r.Status.Conditions {
		if r.Status.Conditions[i].Type == c.Type {
			r.Status.Conditions[i] = c
			return
		}
	}
	r.Status.Conditions = append(r.Status.Conditions, c)
}

// recordPublished remembers the datamesh of the current revision (a revision's datamesh
// never changes once published).
func (w *world) recordPublished() {
	st := &w.rv.Status
	if _, ok := w.published[st.DatameshRevision]; ok {
		return
	}
	snap := attachSnapshot{attached: map[string]bool{}, multi: st.Datamesh.Multiattach}
	for _, m := range st.Datamesh.Members {
		if m.Attached {
			snap.attached[m.Name] = true
		}
	}
	w.published[st.DatameshRevision] = snap
}

// checkPrimaries states the attachment rule by its meaning, after every reconcile of
// every scenario, whatever the expected output says: a replica may be Primary when the
// newest datamesh it has confirmed (the highest published revision not above the one it
// reports) marks it attached. Two replicas that may be Primary must both run a datamesh
// with multiattach on, and never more than two: otherwise an Attach was published before
// a Detach was confirmed (or without multiattach), and a cut could leave two Primaries
// writing. And a replica that may be Primary is still a member: removing it would take
// a writer out of everyone's configuration. A replica of a lost node (ForceLeave, ForceDetach) is left out: that the
// node is gone is what those inputs declare.
func (w *world) checkPrimaries(t testing.TB) {
	t.Helper()
	var prim []string
	multi := true
	for _, r := range w.rvrs {
		if w.lost[r.Name] {
			continue
		}
		best := int64(-1)
		for rev := range w.published {
			if rev <= r.Status.DatameshRevision && rev > best {
				best = rev
			}
		}
		if best < 0 {
			continue
		}
		if snap := w.published[best]; snap.attached[r.Name] {
			prim = append(prim, r.Name)
			multi = multi && snap.multi
			// A replica that may still be Primary is still a member: a removal starts only
			// once its Detach is confirmed (NotAttached counts a Detach in flight).
			member := false
			for _, m := range w.rv.Status.Datamesh.Members {
				member = member || m.Name == r.Name
			}
			if !member {
				t.Fatalf("safety: %s may still be Primary (it confirmed revision %d, attached) but is no longer a member at revision %d",
					r.Name, r.Status.DatameshRevision, w.rv.Status.DatameshRevision)
			}
		}
	}
	if len(prim) > 2 || (len(prim) == 2 && !multi) {
		t.Fatalf("safety: %d replicas may be Primary at once (%v) at revision %d; multiattach in all their datameshes: %v",
			len(prim), prim, w.rv.Status.DatameshRevision, multi)
	}
}
