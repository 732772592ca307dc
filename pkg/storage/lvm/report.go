package lvm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// lvsFields and vgsFields are the report columns the provider asks for. They are
// exactly the columns of the recorded runs (captures 08/13/26/29d and 04/22), so
// the recorded output is the output of the very command the provider issues.
const (
	lvsFields = "lv_name,vg_name,lv_size,lv_attr,lv_tags,lv_path,lv_uuid,pool_lv,data_percent,metadata_percent"
	vgsFields = "vg_name,vg_size,vg_free,vg_extent_size,vg_uuid,vg_tags"
)

// LV is one row of `lvs --reportformat json --units b --nosuffix`.
type LV struct {
	Name string
	VG   string
	// Size in bytes (lv_size; the virtual size for thin volumes).
	Size int64
	// Attr is lv_attr, e.g. "-wi-a-----" (thick), "Vwi-a-tz--" (thin),
	// "twi-aotz--" (thin pool), "Vwi---tz-k" (thin snapshot, activation skipped).
	Attr string
	Tags []string
	// Path is lv_path, "/dev/vg0/rvr-a"; empty for pools and hidden LVs.
	Path string
	UUID string
	// Pool is pool_lv: the thin pool of a thin volume, else empty.
	Pool string
	// DataPercent is data_percent: for thin pools the share of data blocks in
	// use, for thin volumes their mapped share. HasData is false when lvm2
	// reports it empty (thick LVs, inactive thin LVs).
	DataPercent float64
	HasData     bool
	// MetadataPercent is metadata_percent of a thin pool.
	MetadataPercent float64
	HasMetadata     bool
}

// IsThinPool reports whether the row is a thin pool (lv_attr volume type 't').
func (lv LV) IsThinPool() bool { return len(lv.Attr) > 0 && lv.Attr[0] == 't' }

// IsThinVolume reports whether the row is a thin volume or thin snapshot: it
// lives in a pool.
func (lv LV) IsThinVolume() bool { return lv.Pool != "" }

// IsPlainVolume reports whether the row is an ordinary (linear/striped) LV with
// no special role: not a pool, not hidden, not a thin LV. lv_attr's first
// character is '-' for those; 'o' marks an origin of a COW snapshot (29d).
func (lv LV) IsPlainVolume() bool {
	return len(lv.Attr) > 0 && (lv.Attr[0] == '-' || lv.Attr[0] == 'o') && lv.Pool == "" && !strings.HasPrefix(lv.Name, "[")
}

// HasTag reports whether the LV carries tag exactly.
func (lv LV) HasTag(tag string) bool {
	for _, t := range lv.Tags {
		if t == tag {
			return true
		}
	}
	return false
}

// VG is one row of `vgs --reportformat json --units b --nosuffix`.
type VG struct {
	Name       string
	Size       int64
	Free       int64
	ExtentSize int64
	UUID       string
	Tags       []string
}

// report is lvm2's JSON report: {"report": [{"lv": [{...}]}]}. Every value is a
// string, numbers included; --units b --nosuffix makes sizes plain integers.
type report struct {
	Report []map[string][]map[string]string `json:"report"`
}

// decodeReport parses one JSON report document. Anything but whitespace after
// it is an error: lvs prints exactly one document, and trailing text means we
// are not reading what we think we are.
func decodeReport(data []byte, section string) ([]map[string]string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var r report
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("lvm report: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("lvm report: unexpected data after the JSON document")
	}
	if r.Report == nil {
		return nil, fmt.Errorf("lvm report: no \"report\" array")
	}
	var rows []map[string]string
	found := false
	for _, part := range r.Report {
		if rs, ok := part[section]; ok {
			found = true
			rows = append(rows, rs...)
		}
	}
	if !found {
		return nil, fmt.Errorf("lvm report: no %q section", section)
	}
	return rows, nil
}

// ParseLVs parses lvs JSON output. Columns that were not requested are left
// zero; columns present with bad values are errors naming the column and row.
func ParseLVs(data []byte) ([]LV, error) {
	rows, err := decodeReport(data, "lv")
	if err != nil {
		return nil, err
	}
	out := make([]LV, 0, len(rows))
	for i, row := range rows {
		lv := LV{
			Name: row["lv_name"],
			VG:   row["vg_name"],
			Attr: row["lv_attr"],
			Path: row["lv_path"],
			UUID: row["lv_uuid"],
			Pool: row["pool_lv"],
			Tags: splitTags(row["lv_tags"]),
		}
		if lv.Name == "" {
			return nil, fmt.Errorf("lvm report: lv row %d: lv_name is empty", i)
		}
		if lv.Size, err = parseBytes(row, "lv_size"); err != nil {
			return nil, fmt.Errorf("lvm report: lv %q: %w", lv.Name, err)
		}
		if lv.DataPercent, lv.HasData, err = parsePercent(row, "data_percent"); err != nil {
			return nil, fmt.Errorf("lvm report: lv %q: %w", lv.Name, err)
		}
		if lv.MetadataPercent, lv.HasMetadata, err = parsePercent(row, "metadata_percent"); err != nil {
			return nil, fmt.Errorf("lvm report: lv %q: %w", lv.Name, err)
		}
		out = append(out, lv)
	}
	return out, nil
}

// ParseVGs parses vgs JSON output.
func ParseVGs(data []byte) ([]VG, error) {
	rows, err := decodeReport(data, "vg")
	if err != nil {
		return nil, err
	}
	out := make([]VG, 0, len(rows))
	for i, row := range rows {
		vg := VG{Name: row["vg_name"], UUID: row["vg_uuid"], Tags: splitTags(row["vg_tags"])}
		if vg.Name == "" {
			return nil, fmt.Errorf("lvm report: vg row %d: vg_name is empty", i)
		}
		for _, f := range []struct {
			col string
			dst *int64
		}{{"vg_size", &vg.Size}, {"vg_free", &vg.Free}, {"vg_extent_size", &vg.ExtentSize}} {
			if *f.dst, err = parseBytes(row, f.col); err != nil {
				return nil, fmt.Errorf("lvm report: vg %q: %w", vg.Name, err)
			}
		}
		if vg.Free > vg.Size {
			return nil, fmt.Errorf("lvm report: vg %q: vg_free %d exceeds vg_size %d", vg.Name, vg.Free, vg.Size)
		}
		out = append(out, vg)
	}
	return out, nil
}

// parseBytes reads a size column printed with --units b --nosuffix. A missing
// column is 0 (not requested); a unit suffix means the flags were lost and is
// an error rather than a silently wrong number.
func parseBytes(row map[string]string, col string) (int64, error) {
	s, ok := row[col]
	if !ok || s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s %q is not a byte count (was --units b --nosuffix passed?)", col, s)
	}
	return n, nil
}

// parsePercent reads data_percent / metadata_percent ("20.00"; empty when not
// applicable).
func parsePercent(row map[string]string, col string) (float64, bool, error) {
	s, ok := row[col]
	if !ok || s == "" {
		return 0, false, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || f < 0 || f > 100 {
		return 0, false, fmt.Errorf("%s %q is not a percentage", col, s)
	}
	return f, true, nil
}

// splitTags splits lv_tags / vg_tags. lvm2 joins tags with ',' and refuses ','
// inside a tag (capture 16b), so the split is unambiguous.
func splitTags(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
