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

// BackingBytes is enough for every size and not more than the smallest that is,
// in particular at the multiples of 128 MiB where size plus the metadata of size
// falls short.
func TestBackingBytes(t *testing.T) {
	check := func(size int64) {
		b := BackingBytes(size, 7)
		if UsableBytes(b, 7) < size {
			t.Fatalf("BackingBytes(%d) = %d holds only %d", size, b, UsableBytes(b, 7))
		}
		if b%4096 != 0 || UsableBytes(b-4096, 7) >= size {
			t.Fatalf("BackingBytes(%d) = %d, but %d holds it too", size, b, b-4096)
		}
	}
	for size := int64(4096); size <= 2<<30; size += 4096 * 61 {
		check(size)
	}
	for _, size := range []int64{1, 4095, 128 << 20, 1 << 30, 1<<30 - 4096, 10 << 30, 1 << 40} {
		check(size)
	}
	// What GetCapacity offers for free bytes (UsableBytes) fits in them.
	for free := int64(64 << 10); free <= 2<<30; free += 4096*97 + 512 {
		if u := UsableBytes(free, 7); u > 0 && BackingBytes(u, 7) > free {
			t.Fatalf("UsableBytes(%d) = %d needs %d bytes of backing", free, u, BackingBytes(u, 7))
		}
	}
	if b := BackingBytes(128<<20, 7); b <= 128<<20+InternalMetadataBytes(128<<20, 7) {
		t.Fatalf("BackingBytes(128 MiB) = %d: size plus the metadata of size is too little here", b)
	}
}
