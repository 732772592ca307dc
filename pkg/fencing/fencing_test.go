package fencing

import (
	"strings"
	"testing"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

const (
	d  = v1.MemberTypeDiskful
	a  = v1.MemberTypeAccess
	tb = v1.MemberTypeTieBreaker
)

// lost, cut and live build members: on the lost node, reported cut off from it by a
// live agent, and neither (silent, or still connected: the lost side's worst case).
func lost(name string, t v1.MemberType) Member { return Member{Name: name, Type: t, Lost: true} }
func cut(name string, t v1.MemberType) Member  { return Member{Name: name, Type: t, CutOff: true} }
func live(name string, t v1.MemberType) Member { return Member{Name: name, Type: t} }

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members []Member
		q       int
		fenced  bool
		why     string // a part of the answer's words
	}{
		{"2D+1TB, the Primary's node lost, both survivors cut off from it", []Member{lost("d1", d), cut("d2", d), cut("tb", tb)}, 2, true, "d2, tb report no connection"},
		{"2D+1TB, the TieBreaker not reported cut off: the tiebreaker may keep the lost D quorate", []Member{lost("d1", d), cut("d2", d), live("tb", tb)}, 2, false, "replica d1 could still be quorate"},
		{"2D+1TB, the other D not reported cut off", []Member{lost("d1", d), live("d2", d), cut("tb", tb)}, 2, false, "replica d1"},
		{"one D under q=1 (after the q↓): alone it is quorate", []Member{lost("d1", d), cut("tb", tb)}, 1, false, "replica d1"},
		{"3D, both survivors cut off", []Member{lost("d1", d), cut("d2", d), cut("d3", d)}, 2, true, "q=2"},
		{"3D, one survivor silent", []Member{lost("d1", d), cut("d2", d), live("d3", d)}, 2, false, "replica d1"},
		{"1D: nothing else votes", []Member{lost("d1", d)}, 1, false, "replica d1"},
		{"4D+1TB under q=3, two cut off", []Member{lost("d1", d), cut("d2", d), cut("d3", d), live("d4", d), cut("tb", tb)}, 3, true, "d2, d3, tb"},
		{"4D+1TB under q=3, one cut off", []Member{lost("d1", d), cut("d2", d), live("d3", d), live("d4", d), cut("tb", tb)}, 3, false, "replica d1"},
		{"a diskless Primary's node lost, every D cut off", []Member{lost("a1", a), cut("d1", d), cut("d2", d), live("tb", tb)}, 2, true, "a1 cannot hold quorum"},
		{"a diskless Primary's node lost, one D still with it", []Member{lost("a1", a), cut("d1", d), live("d2", d), live("tb", tb)}, 2, false, "replica a1"},
		{"a lost TieBreaker next to a lost-side D", []Member{live("d1", d), cut("d2", d), lost("tb", tb)}, 2, false, "could still be quorate"},
		{"quorum off", []Member{lost("d1", d), cut("d2", d), cut("d3", d)}, 0, false, "quorum is off"},
		{"no member on the lost node", []Member{cut("d1", d), cut("d2", d)}, 2, false, "no member on the lost node"},
		{"a liminal member", []Member{lost("d1", d), cut("d2", d), cut("d3", v1.MemberTypeLiminalDiskful)}, 2, false, "does not model"},
		{"a shadow member", []Member{lost("d1", d), cut("d2", d), cut("s3", v1.MemberTypeShadowDiskful)}, 2, false, "does not model"},
		{"too many cut off to try", []Member{lost("d1", d), cut("d2", d), cut("d3", d), cut("d4", d), cut("d5", d), cut("d6", d), cut("d7", d), cut("d8", d)}, 5, false, "more than the 6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fenced, why := Check(tc.members, tc.q)
			if fenced != tc.fenced || !strings.Contains(why, tc.why) {
				t.Fatalf("Check = %v, %q; want %v and words with %q", fenced, why, tc.fenced, tc.why)
			}
		})
	}
}

// The lost side's DRBD may have marked a cut-off peer Outdated or dropped it from its
// members set; under an explicit q neither lets one D of three reach q=2, and the
// check tries each (a "majority" q would not hold: last man standing).
func TestCheckTriesEveryAbsence(t *testing.T) {
	c := checker{members: []Member{lost("d1", d), cut("d2", d), cut("d3", d)}, side: []int{0}, cut: []int{1, 2}, q: 2, variant: make([]absence, 3)}
	tried := 0
	var rec func(k int)
	rec = func(k int) {
		if k == len(c.cut) {
			tried++
			if who := c.sideQuorate(); who != "" {
				t.Fatalf("variant %v: %s", c.variant, who)
			}
			return
		}
		for a := absentUnknown; a < numAbsence; a++ {
			c.variant[c.cut[k]] = a
			rec(k + 1)
		}
	}
	rec(0)
	if tried != 16 {
		t.Fatalf("tried %d variants, want 16", tried)
	}
}
