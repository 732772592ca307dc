package drbd

import (
	"strings"
	"testing"

	"github.com/meshvol/meshvol/pkg/drbd/internal/captures"
)

func BenchmarkParseEvent(b *testing.B) {
	line := "2026-11-22T00:57:59.696725+00:00 change peer-device name:r0 peer-node-id:1 conn-name:node2 volume:0 replication:Off peer-disk:DUnknown peer-client:no received:0 sent:155985 out-of-sync:0 pending:0 unacked:0"
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseEvent(line); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRender renders the 3D model (what an adjust-or-not decision
// costs). Every render still goes through the drbdadm check hook, which
// dedupes identical files.
func BenchmarkRender(b *testing.B) {
	m := goldenModels()["3d"]
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Render(m.r, m.f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkObserverStream(b *testing.B) {
	stream := string(captures.Read(b, "05-quorum-loss/node1.events2-timestamps-statistics-stream.txt"))
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		m := map[string]*ResourceState{}
		for _, l := range strings.Split(stream, "\n") {
			if l == "" {
				continue
			}
			ev, err := ParseEvent(l)
			if err != nil {
				b.Fatal(err)
			}
			if !ev.EndOfDump {
				_ = applyTo(m, &ev)
			}
		}
	}
}
