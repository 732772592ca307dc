package lvm

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func recordedJSON(t testing.TB, file string) []byte {
	t.Helper()
	c := loadCapture(t, file)
	markReplayed(file)
	return []byte(c.stdout)
}

func TestParseLVsHiddenAndPool(t *testing.T) {
	lvs, err := ParseLVs(recordedJSON(t, "24-lvs-json-pool.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(lvs) != 5 {
		t.Fatalf("%d rows, want 5", len(lvs))
	}
	byName := map[string]LV{}
	for _, lv := range lvs {
		byName[lv.Name] = lv
	}
	tp := byName["tp"]
	if !tp.IsThinPool() || tp.Size != 524288000 || !tp.HasData || tp.DataPercent != 0 || tp.MetadataPercent != 10.84 {
		t.Fatalf("pool row %+v", tp)
	}
	if byName["[tp_tdata]"].IsPlainVolume() || byName["[lvol0_pmspare]"].IsPlainVolume() {
		t.Fatal("hidden LVs taken for plain volumes")
	}
	a := byName["rvr-a"]
	if !a.IsPlainVolume() || !a.HasTag("meshvol.io/owner=rvr-a") || a.HasData || a.Path != "/dev/vg0/rvr-a" {
		t.Fatalf("rvr-a %+v", a)
	}
}

func TestParseLVsOtherColumns(t *testing.T) {
	// 27b asks for other columns (origin, lv_active...); unknown ones are
	// ignored, missing ones are zero.
	lvs, err := ParseLVs(recordedJSON(t, "27b-lvs-after-snapshot.txt")[:strings.Index(loadCapture(t, "27b-lvs-after-snapshot.txt").stdout, "total 0")])
	if err != nil {
		t.Fatal(err)
	}
	if len(lvs) != 5 || lvs[1].Name != "snap-a" || lvs[1].Attr != "Vwi---tz-k" || lvs[1].HasData || lvs[1].Pool != "tp" {
		t.Fatalf("%+v", lvs)
	}
	empty, err := ParseLVs(recordedJSON(t, "06a2-lvs-json-after-failed-lvcreate.txt"))
	if err != nil || len(empty) != 0 {
		t.Fatalf("empty report: %+v %v", empty, err)
	}
	// 21c: lvs of a missing LV still prints an (empty) report, with exit 5.
	if _, err := ParseLVs(recordedJSON(t, "21c-lvs-missing-lv.txt")); err != nil {
		t.Fatal(err)
	}
}

func TestParseVGs(t *testing.T) {
	vgs, err := ParseVGs(recordedJSON(t, "04-vgs-json.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(vgs) != 1 || !reflect.DeepEqual(vgs[0], VG{Name: "vg0", Size: 1069547520, Free: 1069547520, ExtentSize: 4194304, UUID: "AcgYm0-t04X-chTW-Aemv-qryV-lrap-IiL3Wj"}) {
		t.Fatalf("%+v", vgs)
	}
}

func TestParseRejects(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		// Without --units b --nosuffix lvm2 prints "100.00m" (05): refuse it.
		{`{"report":[{"lv":[{"lv_name":"a","lv_size":"100.00m"}]}]}`, "--units b --nosuffix"},
		{`{"report":[{"lv":[{"lv_name":"","lv_size":"1"}]}]}`, "lv_name is empty"},
		{`{"report":[{"lv":[{"lv_name":"a","data_percent":"101"}]}]}`, "not a percentage"},
		{`{"report":[{"lv":[{"lv_name":"a","lv_size":"-1"}]}]}`, "not a byte count"},
		{`{"report":[{"vg":[]}]}`, `no "lv" section`},
		{`{}`, `no "report" array`},
		{`{"report":[{"lv":[]}]} 213909504`, "unexpected data"},
		{``, "lvm report"},
	} {
		if _, err := ParseLVs([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseLVs(%q) = %v, want error containing %q", tc.in, err, tc.want)
		}
	}
	// The raw stdout of 13 has blockdev's number after the JSON.
	if _, err := ParseLVs(recordedJSON(t, "13-lvs-json-after-extend.txt")); err == nil {
		t.Error("trailing blockdev output accepted")
	}
	if _, err := ParseVGs([]byte(`{"report":[{"vg":[{"vg_name":"v","vg_size":"1","vg_free":"2"}]}]}`)); err == nil {
		t.Error("vg_free > vg_size accepted")
	}
}

// FuzzParseReport: the parsers never panic, and what they accept is sane.
// Seeds are every recorded stdout. Run: go test -run=^$ -fuzz=FuzzParseReport -fuzztime=30s ./pkg/storage/lvm
func FuzzParseReport(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.txt")
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		if c, err := parseCapture(file, string(data)); err == nil {
			f.Add([]byte(c.stdout))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if lvs, err := ParseLVs(data); err == nil {
			for _, lv := range lvs {
				if lv.Name == "" || lv.Size < 0 || lv.DataPercent < 0 || lv.DataPercent > 100 || lv.MetadataPercent < 0 || lv.MetadataPercent > 100 {
					t.Fatalf("accepted bad row %+v", lv)
				}
				for _, tag := range lv.Tags {
					if strings.Contains(tag, ",") {
						t.Fatalf("tag with comma %q", tag)
					}
				}
			}
		}
		if vgs, err := ParseVGs(data); err == nil {
			for _, vg := range vgs {
				if vg.Name == "" || vg.Size < 0 || vg.Free < 0 || vg.Free > vg.Size || vg.ExtentSize < 0 {
					t.Fatalf("accepted bad row %+v", vg)
				}
			}
		}
	})
}
