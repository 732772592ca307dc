package drbd

import "testing"

func TestInternalMetadataBytes(t *testing.T) {
	for _, tc := range []struct {
		backing  int64
		peers    int
		wantMeta int64
	}{
		// The captures' 128 MiB with 2 peers: 44 KiB, so DRBD reports size:131028 KiB.
		{128 << 20, 2, 44 << 10},
		// 1 GiB, 7 slots: 32 KiB of bitmap per slot.
		{1 << 30, 7, (36 + 7*32) << 10},
		{0, 7, 0},
	} {
		if got := InternalMetadataBytes(tc.backing, tc.peers); got != tc.wantMeta {
			t.Errorf("InternalMetadataBytes(%d, %d) = %d, want %d", tc.backing, tc.peers, got, tc.wantMeta)
		}
	}
	if got, want := UsableBytes(128<<20, 2), int64(128<<20-44<<10); got != want {
		t.Errorf("UsableBytes(128 MiB, 2) = %d, want %d", got, want)
	}
	if got := UsableBytes(16<<10, 7); got != 0 {
		t.Errorf("UsableBytes(16 KiB, 7) = %d, want 0 (metadata does not fit)", got)
	}
}
