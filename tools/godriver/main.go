// godriver is a minimal DRA kubelet plugin written on k8s.io/dynamic-resource-allocation's
// kubeletplugin helper: the Go peer that benchmarks/prepare.py runs beside dradriver, on
// the same API server and the same kubelet, called by the same client.
//
// It publishes one ResourceSlice of N devices (gpu-0 ... gpu-N-1, in the node's pool) and
// does a real driver's per-claim work on the node: the helper reads the claim from the API
// server and calls PrepareResourceClaims, which writes one CDI spec per claim (a device per
// allocated device; replaced atomically, not fsync'd, as dradriver writes its specs)
// and records the claim in a checkpoint (a JSON file replaced atomically and fsync'd);
// UnprepareResourceClaims removes both.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// cdiVendor and cdiClass make the CDI kind of every device this driver hands out.
const (
	cdiVendor = "godriver.dev"
	cdiClass  = "gpu"
)

// options are the command line's.
type options struct {
	nodeName, kubeconfig, driverName       string
	registrarDir, pluginDir, cdiDir, state string
	devices                                int
	serialize                              bool
	qps                                    float64
}

func main() {
	var o options
	flag.StringVar(&o.nodeName, "node-name", "", "the node this plugin serves (required)")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (empty: in-cluster)")
	flag.StringVar(&o.driverName, "driver-name", "gpu.godriver.dev", "the DRA driver name")
	flag.StringVar(&o.registrarDir, "registrar-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration directory")
	flag.StringVar(&o.pluginDir, "plugin-dir", "", "directory of the DRA socket (default <kubelet plugins dir>/<driver name>)")
	flag.StringVar(&o.cdiDir, "cdi-dir", "/var/run/cdi", "directory the CDI specs are written to")
	flag.StringVar(&o.state, "state-dir", "/var/lib/godriver", "directory of the checkpoint")
	flag.IntVar(&o.devices, "devices", 8, "how many devices to publish")
	flag.BoolVar(&o.serialize, "serialize", true, "let the helper serialize prepare and unprepare calls (its default)")
	flag.Float64Var(&o.qps, "kube-api-qps", -1, "client-side limit on requests to the API server per second (negative: none)")
	klog.InitFlags(nil)
	flag.Parse()
	if o.nodeName == "" {
		klog.Fatal("--node-name is required")
	}
	if o.pluginDir == "" {
		o.pluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, o.driverName)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, stop, o); err != nil {
		klog.Fatal(err)
	}
}

func run(ctx context.Context, cancel func(), o options) error {
	config, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	config.QPS = float32(o.qps) // a negative QPS leaves client-go without a rate limiter
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	for _, dir := range []string{o.registrarDir, o.pluginDir, o.cdiDir, o.state} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	d, err := newDriver(o.driverName, o.cdiDir, filepath.Join(o.state, "checkpoint.json"), cancel)
	if err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(o.nodeName),
		kubeletplugin.DriverName(o.driverName),
		kubeletplugin.RegistrarDirectoryPath(o.registrarDir),
		kubeletplugin.PluginDataDirectoryPath(o.pluginDir),
		kubeletplugin.Serialize(o.serialize),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin helper: %w", err)
	}
	defer helper.Stop()
	pool := resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: inventory(o.devices)}}}
	pools := map[string]resourceslice.Pool{o.nodeName: pool}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: pools}); err != nil {
		return fmt.Errorf("publish resources: %w", err)
	}
	klog.InfoS("serving", "driver", o.driverName, "node", o.nodeName, "devices", o.devices)
	go logRegistration(ctx, helper)
	<-ctx.Done()
	return nil
}

// logRegistration logs the kubelet's answer to the registration once it has come.
func logRegistration(ctx context.Context, helper *kubeletplugin.Helper) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if status := helper.RegistrationStatus(); status != nil {
				klog.InfoS("registration", "registered", status.PluginRegistered, "error", status.Error)
				return
			}
		}
	}
}

// inventory is the node's devices as the ResourceSlice lists them.
func inventory(n int) []resourceapi.Device {
	out := make([]resourceapi.Device, n)
	for i := range out {
		out[i] = resourceapi.Device{
			Name: deviceName(i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"index":       {IntValue: ptr.To(int64(i))},
				"uuid":        {StringValue: ptr.To(fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i))},
				"productName": {StringValue: ptr.To("Fake GPU")},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: resource.MustParse("80Gi")},
			},
		}
	}
	return out
}

func deviceName(i int) string { return "gpu-" + strconv.Itoa(i) }

// preparedDevice is one allocated device of a prepared claim, as the kubelet was told.
type preparedDevice struct {
	Requests []string `json:"requests"`
	Pool     string   `json:"pool"`
	Device   string   `json:"device"`
	CDIIDs   []string `json:"cdiDeviceIDs"`
}

// checkpoint is what the state directory records: every prepared claim by UID.
type checkpoint struct {
	Claims map[types.UID][]preparedDevice `json:"claims"`
}

type driver struct {
	name    string
	cdiDir  string
	path    string // the checkpoint file
	devices map[string]int
	cancel  func()

	mu    sync.Mutex // guards state and the files
	state checkpoint
	inUse map[string]types.UID // device name -> the claim it is prepared for
}

var _ kubeletplugin.DRAPlugin = (*driver)(nil)

func newDriver(name, cdiDir, path string, cancel func()) (*driver, error) {
	d := &driver{name: name, cdiDir: cdiDir, path: path, cancel: cancel,
		state: checkpoint{Claims: map[types.UID][]preparedDevice{}}, inUse: map[string]types.UID{}}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(data, &d.state); err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", path, err)
		}
		for uid, devs := range d.state.Claims {
			for _, dev := range devs {
				d.inUse[dev.Device] = uid
			}
		}
	}
	return d, nil
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devs, err := d.prepare(claim)
		result := kubeletplugin.PrepareResult{Err: err}
		for _, dev := range devs {
			result.Devices = append(result.Devices, kubeletplugin.Device{
				Requests: dev.Requests, PoolName: dev.Pool, DeviceName: dev.Device, CDIDeviceIDs: dev.CDIIDs,
			})
		}
		out[claim.UID] = result
	}
	return out, nil
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim) ([]preparedDevice, error) {
	if devs, ok := d.state.Claims[claim.UID]; ok {
		return devs, nil // prepared before: the kubelet may ask again
	}
	var devs []preparedDevice
	var spec cdiSpec
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.name {
			continue
		}
		if holder, ok := d.inUse[r.Device]; ok {
			return nil, fmt.Errorf("device %s is prepared for claim %s", r.Device, holder)
		}
		name := string(claim.UID) + "-" + r.Device
		spec.Devices = append(spec.Devices, cdiDevice{Name: name, ContainerEdits: cdiEdits{
			Env: []string{"GODRIVER_VISIBLE_DEVICES=" + r.Device},
		}})
		devs = append(devs, preparedDevice{
			Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device,
			CDIIDs: []string{cdiVendor + "/" + cdiClass + "=" + name},
		})
	}
	spec.Version, spec.Kind = "0.6.0", cdiVendor+"/"+cdiClass
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := writeAtomic(d.specPath(claim.UID), data, 0o644, false); err != nil {
		return nil, fmt.Errorf("write the CDI spec: %w", err)
	}
	d.state.Claims[claim.UID] = devs
	if err := d.save(); err != nil {
		delete(d.state.Claims, claim.UID)
		_ = os.Remove(d.specPath(claim.UID))
		return nil, err
	}
	for _, dev := range devs {
		d.inUse[dev.Device] = claim.UID
	}
	return devs, nil
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		out[claim.UID] = d.unprepare(claim.UID)
	}
	return out, nil
}

func (d *driver) unprepare(uid types.UID) error {
	devs, ok := d.state.Claims[uid]
	if !ok {
		return nil // not prepared (or already unprepared): nothing to undo
	}
	if err := os.Remove(d.specPath(uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the CDI spec: %w", err)
	}
	delete(d.state.Claims, uid)
	if err := d.save(); err != nil {
		d.state.Claims[uid] = devs
		return err
	}
	for _, dev := range devs {
		delete(d.inUse, dev.Device)
	}
	return nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	runtime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.cancel()
	}
}

func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, d.name+"-claim-"+string(uid)+".json")
}

func (d *driver) save() error {
	data, err := json.Marshal(d.state)
	if err != nil {
		return err
	}
	if err := writeAtomic(d.path, data, 0o600, true); err != nil {
		return fmt.Errorf("save the checkpoint: %w", err)
	}
	return nil
}

// writeAtomic replaces path with data through a temp file in the same directory renamed
// over it; durable fsyncs the temp file first (the directory is not synced, as the
// kubelet's own checkpoint store does not).
func writeAtomic(path string, data []byte, mode os.FileMode, durable bool) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if err == nil && durable {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// The parts of a CDI spec (https://github.com/cncf-tags/container-device-interface,
// SPEC.md) this driver writes.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env []string `json:"env,omitempty"`
}
