package contract

import "testing"

// TestSameStream: the orders real DRBD produced for stage 05 on the VM
// tier and in the capture are the same stream; a state change out of
// order is not.
func TestSameStream(t *testing.T) {
	captured := []string{"peer-device node2 peer-disk:DUnknown", "call helper:quorum-lost", "path node2 established:no",
		"call helper:disconnected", "connection node2 connection:Unconnected"}
	vm := []string{"peer-device node2 peer-disk:DUnknown", "path node2 established:no", "call helper:quorum-lost",
		"call helper:disconnected", "connection node2 connection:Unconnected"}
	if !sameStream(vm, captured) {
		t.Errorf("helper calls and path changes reordered within their run must compare equal")
	}
	swapped := []string{"call helper:quorum-lost", "peer-device node2 peer-disk:DUnknown", "path node2 established:no",
		"call helper:disconnected", "connection node2 connection:Unconnected"}
	if sameStream(swapped, captured) {
		t.Errorf("a helper call moved across a state change must not compare equal")
	}
	if sameStream(captured[:4], captured) {
		t.Errorf("a missing entry must not compare equal")
	}
}
