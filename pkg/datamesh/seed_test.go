package datamesh

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestSeedTables reads the datamesh specification itself (docs/datamesh-spec.md) and checks
// every row of the four transition tables against DerivePlan, and every step of every
// derived path against the specification's confirmation tables. The datadriven files in
// testdata/plans show the same rows for people; this test makes sure none is missed.
func TestSeedTables(t *testing.T) {
	raw, err := os.ReadFile("../../docs/datamesh-spec.md")
	if err != nil {
		t.Fatal(err)
	}
	seed := string(raw)
	groups := seedConfirmGroups(t, seed)
	rows := 0
	perTable := map[string]int{}
	section := ""
	trRE := regexp.MustCompile(`(AddReplica|RemoveReplica|ForceRemoveReplica|ChangeReplicaType)\(([^)]*)\)`)
	for _, line := range strings.Split(seed, "\n") {
		if strings.HasPrefix(line, "### ") {
			section = strings.TrimPrefix(line, "### ")
			continue
		}
		switch section {
		case "AddReplica", "RemoveReplica", "ForceRemoveReplica", "ChangeReplicaType":
		default:
			continue
		}
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| Transition") {
			continue
		}
		cols := strings.Split(strings.Trim(line, "|"), "|")
		tr, path, when := strings.TrimSpace(cols[0]), strings.TrimSpace(cols[1]), strings.TrimSpace(cols[2])
		m := trRE.FindStringSubmatch(tr)
		if m == nil {
			t.Fatalf("cannot parse %q", line)
		}
		args := strings.Split(m[2], ",")
		var from, to State
		force := false
		switch m[1] {
		case "AddReplica":
			from, to = StateNew, mustState(t, args[0])
		case "RemoveReplica":
			from, to = mustState(t, args[0]), StateGone
		case "ForceRemoveReplica":
			from, to, force = mustState(t, args[0]), StateGone, true
		default:
			from, to = mustState(t, args[0]), mustState(t, args[1])
		}
		flant := strings.Contains(when, "flant-drbd") && !strings.Contains(when, "no flant-drbd")
		p := PathParams{
			VotersOdd: strings.Contains(when, "odd→even"),
			Shadow:    flant || from.IsShadow() || to.IsShadow(),
			QMRUp:     strings.Contains(when, "GMDR < target"),
			QMRDown:   strings.Contains(when, "GMDR > target"),
			Force:     force,
		}
		// "always" rows must hold with and without shadow support, either parity.
		variants := []PathParams{p}
		if when == "always" {
			for _, sh := range []bool{false, true} {
				for _, odd := range []bool{false, true} {
					q := p
					q.Shadow, q.VotersOdd = sh, odd
					variants = append(variants, q)
				}
			}
		}
		for _, v := range variants {
			pl, err := DerivePlan(from, to, v)
			if err != nil {
				t.Errorf("%s (%+v): %v", tr, v, err)
				continue
			}
			if got := pl.Path(); got != path {
				t.Errorf("%s when %s (%+v):\n got  %s\n want %s", tr, when, v, got, path)
			}
			for _, s := range pl.Steps {
				want, ok := groups[s.Kind.key(s)]
				if !ok {
					t.Errorf("%s: step %s has no row in the seed's confirmation tables", tr, s.Name)
					continue
				}
				if force && want == ConfirmFullMeshAffected {
					// Departure: every survivor confirms a force removal, a star
					// member's too (docs/datamesh.md, "Departures from the specification").
					want = ConfirmAll
				}
				if s.Confirm != want {
					t.Errorf("%s: step %s confirms %s, seed says %s", tr, s.Name, s.Confirm, want)
				}
				if s.Force != force {
					t.Errorf("%s: step %s force=%v", tr, s.Name, s.Force)
				}
			}
		}
		rows++
		perTable[section]++
	}
	want := map[string]int{"AddReplica": 11, "RemoveReplica": 7, "ForceRemoveReplica": 8, "ChangeReplicaType": 22}
	for k, n := range want {
		if perTable[k] != n {
			t.Errorf("table %s: %d rows checked, the seed has %d", k, perTable[k], n)
		}
	}
	t.Logf("checked %d seed rows: %v; %d confirmation rows", rows, perTable, len(groups))
}

// key is the confirmation-table key of a step: its From → To (without q), or its name.
func (k StepKind) key(s Step) string {
	if k == StepMember {
		return s.From.String() + " → " + s.To.String()
	}
	return s.Name
}

func mustState(t *testing.T, s string) State {
	st, ok := ParseState(strings.TrimSpace(s))
	if !ok {
		t.Fatalf("unknown state %q", s)
	}
	return st
}

// seedConfirmGroups parses the seed's three confirmation tables.
func seedConfirmGroups(t *testing.T, seed string) map[string]ConfirmGroup {
	part := strings.Split(strings.Split(seed, "### Step confirmation rules")[1], "## Preconditions")[0]
	out := map[string]ConfirmGroup{}
	var g ConfirmGroup
	have := false
	for _, line := range strings.Split(part, "\n") {
		switch {
		case strings.HasPrefix(line, "**Affected replica only**"):
			g, have = ConfirmAffected, true
		case strings.HasPrefix(line, "**FM + affected member**"):
			g, have = ConfirmFullMeshAffected, true
		case strings.HasPrefix(line, "**All replicas**"):
			g, have = ConfirmAll, true
		}
		if have && strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| Step") {
			step := strings.TrimSpace(strings.Split(line, "|")[1])
			out[step] = g
		}
	}
	if len(out) != 4+6+18+2 {
		t.Fatalf("parsed %d confirmation rows, the seed has 30", len(out))
	}
	return out
}

// TestDerivedPlanIDs: the cached plan IDs are DerivePlan's, and every derivable plan is in
// the default registry.
func TestDerivedPlanIDs(t *testing.T) {
	reg := DefaultRegistry()
	n := 0
	for from := State(0); from < numStates; from++ {
		for to := State(0); to < numStates; to++ {
			for bits := 0; bits < numPathParams; bits++ {
				p := pathParamsOf(bits)
				pl, err := DerivePlan(from, to, p)
				id, err2 := DerivedPlanID(from, to, p)
				if (err == nil) != (err2 == nil) || (err == nil && pl.ID != id) {
					t.Fatalf("%s → %s %+v: DerivePlan %q %v, cached %q %v", from, to, p, pl.ID, err, id, err2)
				}
				if err != nil {
					continue
				}
				n++
				if got, ok := reg.Latest(id); !ok || got.Path() != pl.Path() {
					t.Fatalf("plan %s not registered as derived", id)
				}
			}
		}
	}
	t.Logf("%d derivations, %d plans registered", n, len(reg.IDs()))
}
