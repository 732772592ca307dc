package modelcheck

import (
	"fmt"
	"testing"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// TestAttachmentsNeverTwoPrimaries spends the whole budget on attachments: up to four
// attach/detach requests per run (move the attachment, move it back, or attach a
// second node while a Detach or an Attach is unconfirmed), every order in which the
// replicas confirm, no node loss. It checks every invariant, I4p above all: never two
// live replicas running a snapshot in which each is attached without multiattach.
// TestModelCheck's attach pass covers attachments together with a loss and a restart
// within a state cap that a change of bounds can move; this one reaches the moves on
// its own, with maxAttachments 1 and 2, so an engine change that lets a second node
// attach while another Attach or Detach is in flight fails here whatever line it
// touches.
func TestAttachmentsNeverTwoPrimaries(t *testing.T) {
	b := Bounds{Depth: 16, AttachRequests: 4, Spare: 2, MaxStates: 150000}
	for _, l := range StartLayouts[:3] {
		for _, maxAttach := range []int32{1, 2} {
			s := NewScenario(l, false, v1alpha1.TopologyZonal, b)
			s.MaxAttach = maxAttach
			s.Name += fmt.Sprintf("/maxAttachments=%d", maxAttach)
			t.Run(s.Name, func(t *testing.T) {
				t.Parallel()
				checkScenario(t, s)
			})
		}
	}
}
