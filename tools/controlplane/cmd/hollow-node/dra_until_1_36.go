//go:build !since_1_37

package main

import (
	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	kubefeatures "k8s.io/kubernetes/pkg/features"
)

// The container manager's DRA methods as 1.34 to 1.36 declare them (1.37 passes a logger).

// The health half (KEP-4680): only with the ResourceHealthStatus gate, as in the real
// container manager, which fans the DRA manager's updates into its own channel.
func (m *draContainerManager) UpdateAllocatedResourcesStatus(pod *v1.Pod, s *v1.PodStatus) {
	if utilfeature.DefaultFeatureGate.Enabled(kubefeatures.ResourceHealthStatus) {
		m.dra.UpdateAllocatedResourcesStatus(pod, s)
	}
}

func (m *draContainerManager) GetDynamicResources(pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	return m.dynamicResources(pod, container)
}
