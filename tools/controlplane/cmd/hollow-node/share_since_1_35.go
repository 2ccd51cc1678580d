//go:build since_1_35

package main

import (
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra/state"
)

// claimResource is one device of a claim as the 1.35+ container manager reports it:
// with the share ID the driver returned in NodePrepareResources (DRA v1 Device.share_id,
// consumable capacity), which the kubelet keeps in its checkpoint (state.Device.ShareID).
func claimResource(driver string, dev state.Device, ids []*podresourcesapi.CDIDevice) *podresourcesapi.ClaimResource {
	return &podresourcesapi.ClaimResource{
		CdiDevices: ids, DriverName: driver, PoolName: dev.PoolName, DeviceName: dev.DeviceName,
		ShareId: (*string)(dev.ShareID),
	}
}
