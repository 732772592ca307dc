package datamesh

import (
	"slices"
	"strconv"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
)

func itoa(i int) string { return strconv.Itoa(i) }

// resolveConfiguration writes status.configuration from the RSC (Auto) or
// spec.manualConfiguration (Manual). During formation it is frozen: the layout being
// built must not change under it. A source that cannot be resolved keeps the previous
// configuration and says why in a Warning event; transitions in flight go on.
func (rc *reconcile) resolveConfiguration() error {
	rv := rc.in.RV
	if !rc.formationActive() {
		want, ok, why := desiredConfiguration(rv, rc.in.RSC)
		switch {
		case !ok:
			if why != "" {
				rc.event(EventWarning, "ConfigurationUnresolved", why)
			}
		case rc.st.Configuration == nil || !sameConfiguration(rc.st.Configuration, &want):
			if rc.st.Configuration == nil {
				rc.st.Configuration = &v1.ReplicatedVolumeConfiguration{}
			}
			*rc.st.Configuration = want
			rc.st.Configuration.Zones = slices.Clone(want.Zones)
		}
	}
	if c := rc.st.Configuration; c != nil {
		rc.cfg = layout.Layout{FTT: int(c.FailuresToTolerate), GMDR: int(c.GuaranteedMinimumDataRedundancy)}
		if err := rc.cfg.Validate(); err != nil {
			// A configuration that was valid when written cannot become invalid; one
			// written by someone else is refused rather than acted on.
			return inputError("status.configuration." + err.Error())
		}
		rc.hasCfg = true
		rc.baseCfg = rc.cfg
		if rc.in.ExtraFTT > 0 && !rc.formationActive() {
			raised, ok := rc.cfg, true
			for i := 0; i < rc.in.ExtraFTT && ok; i++ {
				raised, ok = raised.RaisedForMaintenance()
			}
			if ok {
				rc.cfg = raised
			}
		}
	}
	return nil
}

type inputError string

func (e inputError) Error() string { return string(e) }

// desiredConfiguration resolves the configuration source. ok=false with a reason when it
// cannot (no class, invalid values); the reason names the field and the rule.
func desiredConfiguration(rv *v1.ReplicatedVolume, rsc *v1.ReplicatedStorageClass) (v1.ReplicatedVolumeConfiguration, bool, string) {
	var c v1.ReplicatedVolumeConfiguration
	switch rv.Spec.ConfigurationMode {
	case v1.ConfigurationModeManual:
		if rv.Spec.ManualConfiguration == nil {
			return c, false, "spec.manualConfiguration: required when configurationMode is Manual"
		}
		c = *rv.Spec.ManualConfiguration
	default:
		if rsc == nil {
			return c, false, "spec.replicatedStorageClassName: storage class " + strconv.Quote(rv.Spec.ReplicatedStorageClassName) + " not found"
		}
		sp := &rsc.Spec
		l, err := layout.FromClass(rsc.Name, (*string)(sp.Replication), sp.FailuresToTolerate, sp.GuaranteedMinimumDataRedundancy)
		if err != nil {
			return c, false, err.Error()
		}
		c = v1.ReplicatedVolumeConfiguration{
			StoragePool:                     sp.StoragePool,
			FailuresToTolerate:              int32(l.FTT),
			GuaranteedMinimumDataRedundancy: int32(l.GMDR),
			Topology:                        sp.Topology,
			Zones:                           sp.Zones,
			VolumeAccess:                    sp.VolumeAccess,
		}
	}
	if c.Topology == "" {
		c.Topology = v1.TopologyIgnored
	}
	if c.VolumeAccess == "" {
		c.VolumeAccess = v1.VolumeAccessPreferablyLocal
	}
	l := layout.Layout{FTT: int(c.FailuresToTolerate), GMDR: int(c.GuaranteedMinimumDataRedundancy)}
	if err := l.Validate(); err != nil {
		return c, false, "configuration: " + err.Error()
	}
	if n := l.MinZones(); c.Topology == v1.TopologyTransZonal && len(c.Zones) > 0 && len(c.Zones) < n {
		// The API refuses this too (CEL); a configuration that slipped through is not
		// acted on: ZoneGMDR/ZoneFTT would block every replacement for ever.
		return c, false, "configuration.zones: TransZonal " + l.String() + " (FTT=" + strconv.Itoa(l.FTT) + ", GMDR=" + strconv.Itoa(l.GMDR) +
			") needs at least " + strconv.Itoa(n) + " zones to survive the loss of one, got " + strconv.Itoa(len(c.Zones))
	}
	return c, true, ""
}

func sameConfiguration(a, b *v1.ReplicatedVolumeConfiguration) bool {
	return a.StoragePool == b.StoragePool && a.FailuresToTolerate == b.FailuresToTolerate &&
		a.GuaranteedMinimumDataRedundancy == b.GuaranteedMinimumDataRedundancy &&
		a.Topology == b.Topology && a.VolumeAccess == b.VolumeAccess && slices.Equal(a.Zones, b.Zones)
}
