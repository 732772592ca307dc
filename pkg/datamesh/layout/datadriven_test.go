package layout

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// The scenario files in testdata/ are the tables of this package: a command,
// "----", the expected output. They are meant to be read without the Go.
// Regenerate after a deliberate change with
//
//	go test ./pkg/datamesh/layout -run TestDataDriven -rewrite
//
// and read the diff: it is the review.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return run(t, d)
		})
	})
}

func run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "layout":
		l := layoutArg(t, d, "ftt", "gmdr")
		if err := l.Validate(); err != nil {
			return "error: " + err.Error()
		}
		dc := l.DiskfulCount()
		return fmt.Sprintf("%s q(%d voters)=%d qmr=%d", l, dc, Quorum(dc, l), QMR(l))

	case "legacy":
		l, err := FromReplication(strArg(t, d, "replication"))
		if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("ftt=%d gmdr=%d %s", l.FTT, l.GMDR, l)

	case "quorum":
		// quorum ftt=F gmdr=G voters=(1,2,3): q for each voter count.
		l := layoutArg(t, d, "ftt", "gmdr")
		arg, _ := d.Arg("voters")
		var out []string
		for _, v := range arg.Vals {
			n := atoi(t, v)
			out = append(out, fmt.Sprintf("q(%d)=%d", n, Quorum(n, l)))
		}
		return strings.Join(out, " ")

	case "tb-min":
		return strconv.Itoa(TieBreakerMin(intArg(t, d, "d"), intArg(t, d, "ftt")))

	case "adr":
		return strconv.Itoa(ADR(intArg(t, d, "uptodate")))

	case "ftt-for-voters":
		l := Layout{GMDR: intArg(t, d, "gmdr")}
		return strconv.Itoa(l.FTTForVoters(intArg(t, d, "voters"), intArg(t, d, "tb")))

	case "ratchet":
		return ratchet(t, d)

	case "guard-qmr-ready":
		return verdict(GuardQMRReady(intArg(t, d, "qmr"), intArg(t, d, "target-gmdr")))
	case "guard-gmdr":
		return verdict(GuardGMDR(intArg(t, d, "uptodate"), boolArg(t, d, "leaving-uptodate"), intArg(t, d, "target-gmdr")))
	case "guard-ftt":
		return verdict(GuardFTT(intArg(t, d, "d"), layoutArg(t, d, "ftt", "gmdr")))
	case "guard-tb-required":
		return verdict(GuardTBRequired(intArg(t, d, "tb"), intArg(t, d, "d"), intArg(t, d, "ftt")))

	case "zone-gmdr":
		return verdict(GuardZoneGMDR(zonesInput(t, d), leavingArg(t, d), intArg(t, d, "target-gmdr")))
	case "zone-ftt":
		return verdict(GuardZoneFTT(zonesInput(t, d), leavingArg(t, d), layoutArg(t, d, "ftt", "gmdr")))
	case "zone-tb":
		return verdict(GuardZoneTBRequired(zonesInput(t, d), strArg(t, d, "tb-zone"), layoutArg(t, d, "ftt", "gmdr")))

	case "survive":
		return survive(t, d)
	}
	t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	return ""
}

// ratchet runs effective-layout steps, one per input line, from
// cfg=(F,G) eff=(F,G) voters=N tb=N:
//
//	members voters=N tb=N     a step changed the voter or TB count
//	qmr uptodate=N            a qmr step: NextQMR, then AfterQMRChange
//	config ftt=F gmdr=G       the configuration changes (no step)
//	formed / reset            formation completed / restarted
//
// Each line prints the state after it: eff, q, qmr.
func ratchet(t *testing.T, d *datadriven.TestData) string {
	cfg := pairArg(t, d, "cfg")
	eff := pairArg(t, d, "eff")
	voters, tb := intArg(t, d, "voters"), intArg(t, d, "tb")
	var b strings.Builder
	state := func(what string) {
		fmt.Fprintf(&b, "%-26s eff=(%d,%d) q=%d qmr=%d  [%d voters, %d TB, cfg (%d,%d)]\n",
			what, eff.FTT, eff.GMDR, Quorum(voters, eff), QMR(eff), voters, tb, cfg.FTT, cfg.GMDR)
	}
	state("start")
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		kv := map[string]int{}
		for _, a := range f[1:] {
			k, v, ok := strings.Cut(a, "=")
			if !ok {
				t.Fatalf("%s: %q: want key=value", d.Pos, a)
			}
			kv[k] = atoi(t, v)
		}
		switch f[0] {
		case "members":
			voters, tb = kv["voters"], kv["tb"]
			eff = eff.AfterMembershipChange(cfg, voters, tb)
		case "qmr":
			q := eff.NextQMR(cfg, kv["uptodate"])
			eff = eff.AfterQMRChange(cfg, q, voters, tb)
			line += " → set qmr=" + strconv.Itoa(q)
		case "config":
			cfg = Layout{FTT: kv["ftt"], GMDR: kv["gmdr"]}
		case "formed":
			eff = Formed(cfg)
		case "reset":
			eff, voters, tb = Reset(), 0, 0
		default:
			t.Fatalf("%s: unknown ratchet step %q", d.Pos, f[0])
		}
		state(line)
	}
	return b.String()
}

// survive prints the brute-force check of one replica set against the DRBD
// model: for each number of failed members, how many failure sets leave a
// voter serving IO, and the first one that does not.
func survive(t *testing.T, d *datadriven.TestData) string {
	l := layoutArg(t, d, "ftt", "gmdr")
	dc := l.DiskfulCount()
	tb := TieBreakerMin(dc, l.FTT)
	if d.HasArg("tb") {
		tb = intArg(t, d, "tb")
	}
	c := layoutConfig(l, dc, tb)
	var b strings.Builder
	fmt.Fprintf(&b, "%dD+%dTB q=%d qmr=%d\n", dc, tb, c.q, c.qmr)
	all := c.members()
	memo := map[uint32]bool{}
	for k := 0; k <= l.FTT+1 && k <= count(all); k++ {
		total, ok, first := 0, 0, ""
		for failed := uint32(0); failed <= all; failed++ {
			if failed&^all != 0 || count(failed) != k {
				continue
			}
			total++
			if servesAfter(c, failed, memo) {
				ok++
			} else if first == "" {
				first = nodeNames(failed, dc)
			}
		}
		fmt.Fprintf(&b, "%d failed: %d/%d sets keep IO", k, ok, total)
		if first != "" {
			fmt.Fprintf(&b, ", not after {%s}", first)
		}
		b.WriteString("\n")
	}
	verdictWord := "tolerates"
	if failureTolerance(c) < l.FTT {
		verdictWord = "does NOT tolerate"
	}
	fmt.Fprintf(&b, "%s %d failures (brute-force FTT %d)", verdictWord, l.FTT, failureTolerance(c))
	return b.String()
}

func nodeNames(m uint32, d int) string {
	var s []string
	for i := 0; m>>i != 0; i++ {
		if m&(1<<i) == 0 {
			continue
		}
		if i < d {
			s = append(s, "D"+strconv.Itoa(i+1))
		} else {
			s = append(s, "TB"+strconv.Itoa(i-d+1))
		}
	}
	return strings.Join(s, ",")
}

// zonesInput reads one zone per input line:
//
//	z1 d=2 uptodate=2 tb=0 diskless=0
func zonesInput(t *testing.T, d *datadriven.TestData) []ZoneCount {
	var zs []ZoneCount
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		z := ZoneCount{Zone: f[0]}
		for _, a := range f[1:] {
			k, v, ok := strings.Cut(a, "=")
			if !ok {
				t.Fatalf("%s: %q: want key=value", d.Pos, a)
			}
			n := atoi(t, v)
			switch k {
			case "d":
				z.D = n
			case "uptodate":
				z.UpToDateD = n
			case "tb":
				z.TB = n
			case "diskless":
				z.Diskless = n
			default:
				t.Fatalf("%s: unknown zone field %q", d.Pos, k)
			}
		}
		zs = append(zs, z)
	}
	return zs
}

func leavingArg(t *testing.T, d *datadriven.TestData) Leaving {
	l := Leaving{Zone: strArg(t, d, "leaving"), UpToDate: true}
	if d.HasArg("leaving-uptodate") {
		l.UpToDate = boolArg(t, d, "leaving-uptodate")
	}
	return l
}

func verdict(ok bool, msg string) string {
	if ok {
		if msg != "" {
			return "ok, but with a message: " + msg
		}
		return "ok"
	}
	return "blocked: " + msg
}

func layoutArg(t *testing.T, d *datadriven.TestData, ftt, gmdr string) Layout {
	return Layout{FTT: intArg(t, d, ftt), GMDR: intArg(t, d, gmdr)}
}

func pairArg(t *testing.T, d *datadriven.TestData, key string) Layout {
	a, ok := d.Arg(key)
	if !ok || len(a.Vals) != 2 {
		t.Fatalf("%s: want %s=(FTT,GMDR)", d.Pos, key)
	}
	return Layout{FTT: atoi(t, a.Vals[0]), GMDR: atoi(t, a.Vals[1])}
}

func intArg(t *testing.T, d *datadriven.TestData, key string) int {
	return atoi(t, strArg(t, d, key))
}

func boolArg(t *testing.T, d *datadriven.TestData, key string) bool {
	v, err := strconv.ParseBool(strArg(t, d, key))
	if err != nil {
		t.Fatalf("%s: %s: %v", d.Pos, key, err)
	}
	return v
}

func strArg(t *testing.T, d *datadriven.TestData, key string) string {
	a, ok := d.Arg(key)
	if !ok || len(a.Vals) != 1 {
		t.Fatalf("%s: missing argument %s=", d.Pos, key)
	}
	return a.Vals[0]
}

func atoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return n
}
