//go:build !since_1_35

package main

import (
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra/state"
)

// claimResource is one device of a claim as 1.34's container manager reports it.
func claimResource(driver string, dev state.Device, ids []*podresourcesapi.CDIDevice) *podresourcesapi.ClaimResource {
	return &podresourcesapi.ClaimResource{
		CdiDevices: ids, DriverName: driver, PoolName: dev.PoolName, DeviceName: dev.DeviceName,
	}
}
