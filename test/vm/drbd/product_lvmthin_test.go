//go:build vmtest

package drbd_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/scenario"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// LVM thin, the pool type users run, on the product tier's guests: each
// guest's second disk (/dev/vdb, hack/vm-test-drbd.sh) holds the volume
// group thinVG with the thin pool thinPoolLV, made here as an administrator
// prepares a node, and the ReplicatedStoragePool thinPoolName names them.
const (
	thinVG       = "meshvol"
	thinPoolLV   = "thin"
	thinPoolName = "lvmthin"
	thinDisk     = "/dev/vdb"
	// thinPoolSize leaves the 1 GiB disk room for the pool's metadata and
	// lvm2's spare metadata volume.
	thinPoolSize = "768m"
	// lvmConfig is what pkg/storage/lvm passes to every lvm2 command: the
	// guests, like the node agent's container, have no udev.
	lvmConfig = "activation { udev_sync = 0 udev_rules = 0 }"
)

// thinBackend is the product tier with the LVM thin pool as the scenarios'
// pool: a backing volume left behind is a thin LV named after the volume.
type thinBackend struct{ *product }

func (thinBackend) Pool() string { return thinPoolName }

func (b thinBackend) Leftovers(ctx context.Context, node, volume string) ([]string, error) {
	left, err := b.product.Leftovers(ctx, node, volume)
	if err != nil {
		return nil, err
	}
	lvs, err := b.lvs(ctx, node)
	if err != nil {
		return nil, err
	}
	for _, lv := range lvs {
		if strings.Contains(lv.name, volume) {
			left = append(left, "LV "+thinVG+"/"+lv.name)
		}
	}
	return left, nil
}

// thinLV is one line of lvs in the guest's volume group.
type thinLV struct {
	name, pool  string
	size        int64
	dataPercent float64
}

func (b thinBackend) lvs(ctx context.Context, node string) ([]thinLV, error) {
	out, err := b.Shell(ctx, node, fmt.Sprintf("lvs --config '%s' --noheadings --nosuffix --units b --separator , -o lv_name,pool_lv,lv_size,data_percent %s", lvmConfig, thinVG))
	if err != nil {
		return nil, fmt.Errorf("lvs on %s: %w", node, err)
	}
	var lvs []thinLV
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(strings.TrimSpace(line), ",")
		if len(f) != 4 {
			continue
		}
		lv := thinLV{name: f[0], pool: f[1]}
		lv.size, _ = strconv.ParseInt(f[2], 10, 64)
		lv.dataPercent, _ = strconv.ParseFloat(f[3], 64)
		lvs = append(lvs, lv)
	}
	return lvs, nil
}

// TestProductLVMThin runs the scenarios that form, attach, write, move, grow
// and delete volumes (1, 2, 3, 4, 9) on an LVMThin pool on real DRBD: the
// agent's thin provider creates each Diskful replica's thin LV, DRBD runs on
// it, CreateVolume's 1D, 2D+1TB and 3D reach Ready as the kernel says, the
// file written on one guest reads back on the other, the volume grows
// online (lvextend under DRBD's resize), and DeleteVolume removes every LV.
// Before scenario 9 it checks what lies under each volume: every Diskful
// member's DRBD disk is its thin LV in the pool, the written one holds data.
// It runs before TestProduct (files run in name order), whose scenario 5
// crashes a guest for good.
func TestProductLVMThin(t *testing.T) {
	waitProduct(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	b := thinBackend{prod}
	began := time.Now()
	var vgs []v1.PoolVolumeGroup
	for _, n := range prod.names {
		script := fmt.Sprintf("set -e; exec 2>&1; c='%[1]s'; pvcreate --config \"$c\" -y %[2]s; vgcreate --config \"$c\" %[3]s %[2]s; lvcreate --config \"$c\" -y --type thin-pool -L %[4]s -n %[5]s %[3]s",
			lvmConfig, thinDisk, thinVG, thinPoolSize, thinPoolLV)
		if out, err := prod.Shell(ctx, n, script); err != nil {
			t.Fatalf("making the thin pool on %s: %v: %s", n, err, out)
		}
		vgs = append(vgs, v1.PoolVolumeGroup{NodeName: n, Name: thinVG, ThinPool: thinPoolLV})
	}
	if err := prod.env.Client.Create(ctx, &v1.ReplicatedStoragePool{ObjectMeta: metav1.ObjectMeta{Name: thinPoolName},
		Spec: v1.ReplicatedStoragePoolSpec{Type: v1.PoolTypeLVMThin, VolumeGroups: vgs}}); err != nil {
		t.Fatal(err)
	}
	if err := scenario.WaitPool(ctx, b, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("thin pools made and the LVMThin pool ready on every guest in %s", time.Since(began).Round(100*time.Millisecond))

	inspect := func(t *testing.T, volumes []string) {
		for _, id := range volumes {
			var rvrs v1.ReplicatedVolumeReplicaList
			if err := prod.env.Client.List(ctx, &rvrs, client.MatchingLabels{v1.LabelVolume: id}); err != nil {
				t.Fatal(err)
			}
			diskful := 0
			for _, x := range rvrs.Items {
				if x.Spec.Type != v1.ReplicaTypeDiskful {
					continue
				}
				diskful++
				node := x.Spec.NodeName
				if s := x.Spec.Storage; s == nil || s.VolumeGroup != thinVG || s.ThinPool != thinPoolLV {
					t.Errorf("%s: replica %s's storage is %+v, want volume group %s, thin pool %s", id, x.Name, s, thinVG, thinPoolLV)
				}
				lvs, err := b.lvs(ctx, node)
				if err != nil {
					t.Fatal(err)
				}
				var lv *thinLV
				for i := range lvs {
					if strings.Contains(lvs[i].name, id) {
						if lv != nil {
							t.Errorf("%s: two LVs on %s: %s and %s", id, node, lv.name, lvs[i].name)
						}
						lv = &lvs[i]
					}
				}
				if lv == nil {
					t.Errorf("%s: no LV named after it on %s (lvs: %+v)", id, node, lvs)
					continue
				}
				if lv.pool != thinPoolLV {
					t.Errorf("%s: LV %s on %s is in pool %q, want the thin pool %s", id, lv.name, node, lv.pool, thinPoolLV)
				}
				show, err := prod.DRBD(node).Show(ctx, id)
				if err != nil || len(show) != 1 || len(show[0].ThisHost.Volumes) != 1 {
					t.Fatalf("%s: drbdsetup show on %s: %v (%d resources)", id, node, err, len(show))
				}
				if got, want := show[0].ThisHost.Volumes[0].BackingDisk, "/dev/"+thinVG+"/"+lv.name; got != want {
					t.Errorf("%s: DRBD's disk on %s is %q, want the thin LV %s", id, node, got, want)
				}
				t.Logf("%s on %s: thin LV %s/%s, %d bytes, %.2f%% allocated, DRBD's disk", id, node, thinVG, lv.name, lv.size, lv.dataPercent)
				if lv.dataPercent <= 0 {
					t.Errorf("%s: thin LV %s on %s has nothing allocated after mkfs and the writes", id, lv.name, node)
				}
			}
			if diskful == 0 {
				t.Errorf("%s: no Diskful replica", id)
			}
		}
	}
	rec := scenario.Run(ctx, t, b, scenario.Options{Wait: 10 * time.Minute, Prefix: "thin-",
		Only: []string{"1-create", "2-publish-write", "3-move", "4-expand", "9-delete"}, Inspect: inspect})
	rec.Print(os.Stdout)
}
