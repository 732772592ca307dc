package layout

import (
	"errors"
	"strings"
	"testing"
)

func TestFromClass(t *testing.T) {
	i32 := func(n int32) *int32 { return &n }
	str := func(s string) *string { return &s }
	for _, c := range []struct {
		name       string
		repl       *string
		ftt, gmdr  *int32
		want       Layout
		wantErr    string // "" when accepted
		wantsField string
	}{
		{"replication", str("ConsistencyAndAvailability"), nil, nil, Layout{FTT: 1, GMDR: 1}, "", ""},
		{"both levels", nil, i32(1), i32(0), Layout{FTT: 1, GMDR: 0}, "", ""},
		{"levels out of range are for Validate", nil, i32(2), i32(0), Layout{FTT: 2, GMDR: 0}, "", ""},
		{"failuresToTolerate alone", nil, i32(1), nil, Layout{}, "storage class gold: guaranteedMinimumDataRedundancy: required", "guaranteedMinimumDataRedundancy"},
		{"guaranteedMinimumDataRedundancy alone", nil, nil, i32(1), Layout{}, "storage class gold: failuresToTolerate: required", "failuresToTolerate"},
		{"nothing", nil, nil, nil, Layout{}, "storage class gold: failuresToTolerate: required", "failuresToTolerate"},
		{"unknown replication", str("Most"), nil, nil, Layout{}, "storage class gold: replication: must be one of", "replication"},
	} {
		got, err := FromClass("gold", c.repl, c.ftt, c.gmdr)
		if c.wantErr == "" {
			if err != nil || got != c.want {
				t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
			}
			continue
		}
		if err == nil || !strings.HasPrefix(err.Error(), c.wantErr) {
			t.Errorf("%s: %v, want an error starting %q", c.name, err, c.wantErr)
			continue
		}
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Field != c.wantsField {
			t.Errorf("%s: %v does not name field %s", c.name, err, c.wantsField)
		}
	}
}
