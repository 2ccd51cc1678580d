package main

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/component-base/metrics/legacyregistry"
	internalapi "k8s.io/cri-api/pkg/apis"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	kubefeatures "k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/resourceupdates"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	"k8s.io/kubernetes/pkg/kubelet/status"
)

// draContainerManager is kubemark's stub container manager (no cgroups, no CPU, memory
// or device-plugin managers) with every DRA method handed to the kubelet's real DRA
// manager, wired the way pkg/kubelet/cm/container_manager_linux.go wires it. That file
// is the reference for each override below: when the kubelet changes how it drives DRA,
// this is the file to compare with it.
type draContainerManager struct {
	cm.ContainerManager
	dra *dra.Manager
}

var _ cm.ContainerManager = &draContainerManager{}

func newDRAContainerManager(client clientset.Interface, rootDir string) (*draContainerManager, error) {
	// The real container manager creates the DRA manager with the kubelet's root
	// directory as its state directory: its checkpoint (dra_manager_state) lives there.
	m, err := dra.NewManager(klog.TODO(), client, rootDir)
	if err != nil {
		return nil, fmt.Errorf("creating the DRA manager: %w", err)
	}
	legacyregistry.CustomMustRegister(m.NewMetricsCollector())
	return &draContainerManager{ContainerManager: cm.NewStubContainerManager(), dra: m}, nil
}

// Start starts the stub, then the DRA manager: its plugin handler exists only after
// Start, and the kubelet asks for the handlers after starting the container manager.
func (m *draContainerManager) Start(ctx context.Context, node *v1.Node, activePods cm.ActivePodsFunc,
	getNode cm.GetNodeFunc, sourcesReady config.SourcesReady, podStatusProvider status.PodStatusProvider,
	runtimeService internalapi.RuntimeService, localStorageCapacityIsolation bool) error {
	if err := m.ContainerManager.Start(ctx, node, activePods, getNode, sourcesReady, podStatusProvider,
		runtimeService, localStorageCapacityIsolation); err != nil {
		return err
	}
	if err := m.dra.Start(ctx, dra.ActivePodsFunc(activePods), dra.GetNodeFunc(getNode), sourcesReady); err != nil {
		return fmt.Errorf("start dra manager error: %w", err)
	}
	return nil
}

func (m *draContainerManager) GetPluginRegistrationHandlers() map[string]cache.PluginHandler {
	return map[string]cache.PluginHandler{pluginwatcherapi.DRAPlugin: m.dra.GetWatcherHandler()}
}

// GetResources adds the CDI device IDs of the container's claims to the run options;
// the runtime (cri.go) resolves them against the node's CDI spec directories.
func (m *draContainerManager) GetResources(ctx context.Context, pod *v1.Pod, container *v1.Container) (*kubecontainer.RunContainerOptions, error) {
	opts, err := m.ContainerManager.GetResources(ctx, pod, container)
	if err != nil {
		return nil, err
	}
	info, err := m.dra.GetResources(pod, container)
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(5).Info("Determined CDI devices for pod", "pod", klog.KObj(pod), "cdiDevices", info.CDIDevices)
	opts.CDIDevices = append(opts.CDIDevices, info.CDIDevices...)
	return opts, nil
}

func (m *draContainerManager) PrepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	return m.dra.PrepareResources(ctx, pod)
}

func (m *draContainerManager) UnprepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	return m.dra.UnprepareResources(ctx, pod)
}

// PodMightNeedToUnprepareResources keeps a deleted pod's object in the API server until
// its claims are unprepared; the stub's "false" would let it go first.
func (m *draContainerManager) PodMightNeedToUnprepareResources(uid types.UID) bool {
	return m.dra.PodMightNeedToUnprepareResources(uid)
}

func (m *draContainerManager) Updates() <-chan resourceupdates.Update {
	if utilfeature.DefaultFeatureGate.Enabled(kubefeatures.ResourceHealthStatus) {
		return m.dra.Updates()
	}
	return nil
}

// dynamicResources answers the PodResources API (<root>/pod-resources/kubelet.sock;
// GetDynamicResources, whose signature is the line's: dra_until_1_36.go)
// with the claims, devices and CDI IDs the kubelet holds for a container. It keeps the
// real container manager's shape exactly, including that a device's CDI list also
// carries the IDs of the devices listed before it for the same driver: the harness
// must answer what a production kubelet answers.
func (m *draContainerManager) dynamicResources(pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	infos, err := m.dra.GetContainerClaimInfos(pod, container)
	if err != nil {
		klog.ErrorS(err, "Unable to get container claim info state")
		return []*podresourcesapi.DynamicResource{}
	}
	var out []*podresourcesapi.DynamicResource
	for _, info := range infos {
		var resources []*podresourcesapi.ClaimResource
		for driver, state := range info.DriverState {
			var ids []*podresourcesapi.CDIDevice
			for _, dev := range state.Devices {
				for _, id := range dev.CDIDeviceIDs {
					ids = append(ids, &podresourcesapi.CDIDevice{Name: id})
				}
				resources = append(resources, claimResource(driver, dev, ids))
			}
		}
		out = append(out, &podresourcesapi.DynamicResource{
			ClaimName: info.ClaimName, ClaimNamespace: info.Namespace, ClaimResources: resources,
		})
	}
	return out
}
