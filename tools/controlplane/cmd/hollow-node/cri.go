package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// cdiRuntime is the CRI runtime of the hollow node: cri-client's fake runtime (what
// kubemark runs), except that CreateContainer resolves the container's CDI devices
// with the CDI reference library against the node's spec directories, as containerd
// does with enable_cdi, and fails the container with containerd's message when one is
// unresolvable. What each container got is written as JSON under recordsDir, where
// tests and the demo read it; a pod's records go when its sandbox is stopped.
//
// Its sandboxes, containers and images are saved to stateFile after every change and
// loaded at start, so a killed and restarted kubelet finds its pods' containers still
// running, as it finds them in containerd, which outlives the kubelet: a kubelet
// restart leaves pods untouched.
type cdiRuntime struct {
	*fakeremote.RemoteRuntime
	server     *grpc.Server
	cdiDirs    []string
	recordsDir string
	stateFile  string
	saveMu     sync.Mutex

	mu sync.Mutex
	// Containers that exit as soon as they start, by container ID: a container whose
	// command is `true` (exit 0) or `false` (exit 1) "runs" that command. Nothing else
	// ever exits, as in kubemark (but a host process, below); this is what lets init
	// containers complete.
	exitCodes map[string]int32
	// Containers of the --exec-image images, which run as processes of this host.
	procs *hostProcs
}

// ContainerRecord is what a container received from the runtime: the pod's own env
// with the CDI edits applied over it (as the OCI spec's process env would hold it),
// and the device nodes, mounts and hooks the CDI specs added.
type ContainerRecord struct {
	Pod         string       `json:"pod"`
	Namespace   string       `json:"namespace"`
	PodUID      string       `json:"podUID"`
	Container   string       `json:"container"`
	Attempt     uint32       `json:"attempt"`
	ContainerID string       `json:"containerID"`
	Command     []string     `json:"command"`
	CDIDevices  []string     `json:"cdiDevices"`
	Env         []string     `json:"env"`
	DeviceNodes []deviceNode `json:"deviceNodes"`
	Mounts      []mount      `json:"mounts"`
	Hooks       []hook       `json:"hooks"`
}

type deviceNode struct {
	Path     string  `json:"path"`
	Type     string  `json:"type"`
	Major    int64   `json:"major"`
	Minor    int64   `json:"minor"`
	FileMode *uint32 `json:"fileMode"`
	UID      *uint32 `json:"uid"`
	GID      *uint32 `json:"gid"`
}

type mount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options"`
	Type          string   `json:"type"`
}

type hook struct {
	HookName string   `json:"hookName"`
	Path     string   `json:"path"`
	Args     []string `json:"args"`
	Env      []string `json:"env"`
	Timeout  *int     `json:"timeout"`
}

func newCDIRuntime(cdiDirs []string, recordsDir, stateFile string, procs *hostProcs) *cdiRuntime {
	r := &cdiRuntime{
		RemoteRuntime: fakeremote.NewFakeRemoteRuntime(),
		server:        grpc.NewServer(),
		cdiDirs:       cdiDirs,
		recordsDir:    recordsDir,
		stateFile:     stateFile,
		exitCodes:     map[string]int32{},
		procs:         procs,
	}
	procs.exited = r.processExited
	runtimeapi.RegisterRuntimeServiceServer(r.server, r)
	runtimeapi.RegisterImageServiceServer(r.server, r)
	return r
}

// Serve listens on a Unix socket (a stale one from a killed run is replaced), so the
// kubelet reaches the runtime through its real CRI client, and marks runtime and
// network ready as the fake runtime's own Start does.
func (r *cdiRuntime) Serve(ctx context.Context, socket string) error {
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return err
	}
	if err := r.load(); err != nil {
		return err
	}
	_ = os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", socket, err)
	}
	r.RuntimeService.Lock()
	r.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	r.RuntimeService.Unlock()
	go func() { _ = r.server.Serve(l) }()
	go r.forgetCalls(ctx)
	return nil
}

func (r *cdiRuntime) Stop() { r.server.Stop() }

// forgetCalls empties the fake's call log, which grows with every CRI call (the kubelet
// relists every second) and which nothing here reads.
func (r *cdiRuntime) forgetCalls(ctx context.Context) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.RuntimeService.Lock()
			r.RuntimeService.Called = nil
			r.RuntimeService.Unlock()
			r.ImageService.Lock()
			r.ImageService.Called = nil
			r.ImageService.Unlock()
		}
	}
}

func (r *cdiRuntime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	cfg := req.GetConfig()
	ids := make([]string, 0, len(cfg.GetCDIDevices()))
	for _, d := range cfg.GetCDIDevices() {
		ids = append(ids, d.GetName())
	}
	env := make([]string, 0, len(cfg.GetEnvs()))
	for _, kv := range cfg.GetEnvs() {
		// A string until cri-api 0.35, bytes from 0.36: %s prints either.
		env = append(env, fmt.Sprintf("%s=%s", kv.GetKey(), kv.GetValue()))
	}
	spec := &oci.Spec{Process: &oci.Process{Env: env}, Linux: &oci.Linux{}}
	if len(ids) > 0 {
		if err := r.inject(spec, ids); err != nil {
			// containerd applies CDI while creating the container, so its error reads
			// "failed to create containerd container: CDI device injection failed: ...".
			msg := "failed to create containerd container: CDI device injection failed: " + err.Error()
			klog.InfoS("Container creation failed", "pod", podOf(req.GetSandboxConfig()), "container", cfg.GetMetadata().GetName(), "err", msg)
			return nil, grpcstatus.Error(codes.Unknown, msg)
		}
	}
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	command := append(append([]string{}, cfg.GetCommand()...), cfg.GetArgs()...)
	if r.procs.created(resp.ContainerId, cfg, spec.Process.Env) {
		// Runs for real at StartContainer.
	} else if len(command) > 0 {
		switch filepath.Base(command[0]) {
		case "true":
			r.setExit(resp.ContainerId, 0)
		case "false":
			r.setExit(resp.ContainerId, 1)
		}
	}
	meta := req.GetSandboxConfig().GetMetadata()
	rec := ContainerRecord{
		Pod: meta.GetName(), Namespace: meta.GetNamespace(), PodUID: meta.GetUid(),
		Container: cfg.GetMetadata().GetName(), Attempt: cfg.GetMetadata().GetAttempt(),
		ContainerID: resp.ContainerId, Command: orEmpty(command), CDIDevices: ids,
	}
	fillFromOCI(&rec, spec)
	if err := r.write(rec); err != nil {
		// The container exists; a missing record only starves the observers, so say so
		// loudly rather than fail a container a real runtime would have created.
		klog.ErrorS(err, "Writing the container record failed", "pod", podOf(req.GetSandboxConfig()), "container", rec.Container)
	}
	r.save()
	klog.InfoS("Container created", "pod", podOf(req.GetSandboxConfig()), "container", rec.Container,
		"cdiDevices", strings.Join(ids, ","))
	return resp, nil
}

func (r *cdiRuntime) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	resp, err := r.RemoteRuntime.StartContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := r.procs.start(req.ContainerId); err != nil {
		klog.InfoS("Container start failed", "containerID", req.ContainerId, "err", err)
		r.setExit(req.ContainerId, 128)
	}
	r.mu.Lock()
	code, exits := r.exitCodes[req.ContainerId]
	r.mu.Unlock()
	if exits {
		r.RuntimeService.Lock()
		if c, ok := r.RuntimeService.Containers[req.ContainerId]; ok {
			c.State = runtimeapi.ContainerState_CONTAINER_EXITED
			c.ExitCode = code
			c.FinishedAt = time.Now().UnixNano()
			c.Reason = map[int32]string{0: "Completed", 1: "Error", 128: "StartError"}[code]
		}
		r.RuntimeService.Unlock()
	}
	r.save()
	return resp, nil
}

func (r *cdiRuntime) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	r.procs.stop(req.ContainerId, req.Timeout)
	resp, err := r.RemoteRuntime.StopContainer(ctx, req)
	if err == nil {
		r.save()
	}
	return resp, err
}

func (r *cdiRuntime) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	r.mu.Lock()
	delete(r.exitCodes, req.ContainerId)
	r.mu.Unlock()
	r.procs.stop(req.ContainerId, 0)
	r.procs.forget(req.ContainerId)
	resp, err := r.RemoteRuntime.RemoveContainer(ctx, req)
	if err == nil {
		r.save()
	}
	return resp, err
}

func (r *cdiRuntime) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	resp, err := r.RemoteRuntime.RunPodSandbox(ctx, req)
	if err == nil {
		r.save()
	}
	return resp, err
}

func (r *cdiRuntime) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	resp, err := r.RemoteRuntime.PullImage(ctx, req)
	if err == nil {
		r.save()
	}
	return resp, err
}

// StopPodSandbox drops the pod's container records with the sandbox: its containers
// are gone, and a pod that is gone leaves nothing behind on the node. (The sandbox
// itself stays until the kubelet's garbage collection removes it, as with containerd.)
func (r *cdiRuntime) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	uid := r.sandboxUID(req.PodSandboxId)
	resp, err := r.RemoteRuntime.StopPodSandbox(ctx, req)
	if err != nil {
		return nil, err
	}
	r.save()
	r.dropRecords(uid)
	return resp, nil
}

func (r *cdiRuntime) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	uid := r.sandboxUID(req.PodSandboxId)
	resp, err := r.RemoteRuntime.RemovePodSandbox(ctx, req)
	if err != nil {
		return nil, err
	}
	r.save()
	r.dropRecords(uid)
	return resp, nil
}

func (r *cdiRuntime) sandboxUID(id string) string {
	r.RuntimeService.Lock()
	defer r.RuntimeService.Unlock()
	if s, ok := r.RuntimeService.Sandboxes[id]; ok {
		return s.GetMetadata().GetUid()
	}
	return ""
}

func (r *cdiRuntime) dropRecords(uid string) {
	if uid == "" || strings.ContainsAny(uid, "/.") {
		return
	}
	if err := os.RemoveAll(filepath.Join(r.recordsDir, uid)); err != nil {
		klog.ErrorS(err, "Removing container records failed", "podUID", uid)
	}
}

// runtimeState is what survives a restart of the process, as containerd's own store does.
type runtimeState struct {
	Sandboxes  map[string]*apitest.FakePodSandbox `json:"sandboxes"`
	Containers map[string]*apitest.FakeContainer  `json:"containers"`
	Images     map[string]*runtimeapi.Image       `json:"images"`
	ExitCodes  map[string]int32                   `json:"exitCodes"`
	// The host processes of --exec-image containers, and their commands not yet started.
	Processes map[string]hostProc    `json:"processes"`
	Pending   map[string]hostCommand `json:"pending"`
}

// save writes the runtime's state atomically. A failed save is logged, not returned:
// the call it follows has happened, and a lost save costs only a later restart's view.
// Each part is encoded under its own lock, so the fakes are never held while writing.
func (r *cdiRuntime) save() {
	r.saveMu.Lock()
	defer r.saveMu.Unlock()
	parts := map[string]json.RawMessage{}
	encode := func(name string, lock sync.Locker, v any) error {
		lock.Lock()
		defer lock.Unlock()
		data, err := json.Marshal(v)
		parts[name] = data
		return err
	}
	var err error
	for _, p := range []struct {
		name string
		lock sync.Locker
		v    any
	}{
		{"sandboxes", r.RuntimeService, &r.RuntimeService.Sandboxes},
		{"containers", r.RuntimeService, &r.RuntimeService.Containers},
		{"images", r.ImageService, &r.ImageService.Images},
		{"exitCodes", &r.mu, &r.exitCodes},
		{"processes", &r.procs.mu, &r.procs.running},
		{"pending", &r.procs.mu, &r.procs.pending},
	} {
		if err = encode(p.name, p.lock, p.v); err != nil {
			break
		}
	}
	var data []byte
	if err == nil {
		data, err = json.Marshal(parts)
	}
	if err == nil {
		tmp := r.stateFile + ".tmp"
		if err = os.WriteFile(tmp, data, 0o600); err == nil {
			err = os.Rename(tmp, r.stateFile)
		}
	}
	if err != nil {
		klog.ErrorS(err, "Saving the runtime state failed", "path", r.stateFile)
	}
}

func (r *cdiRuntime) load() error {
	data, err := os.ReadFile(r.stateFile)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var st runtimeState
	if err := json.Unmarshal(data, &st); err != nil {
		// A torn file: start empty, as a runtime that lost its store would; the
		// kubelet then recreates the pods' sandboxes.
		klog.ErrorS(err, "Runtime state unreadable; starting empty", "path", r.stateFile)
		return nil
	}
	r.RuntimeService.Lock()
	if st.Sandboxes != nil {
		r.RuntimeService.Sandboxes = st.Sandboxes
	}
	if st.Containers != nil {
		r.RuntimeService.Containers = st.Containers
	}
	r.RuntimeService.Unlock()
	r.ImageService.Lock()
	if st.Images != nil {
		r.ImageService.Images = st.Images
	}
	r.ImageService.Unlock()
	r.mu.Lock()
	if st.ExitCodes != nil {
		r.exitCodes = st.ExitCodes
	}
	r.mu.Unlock()
	r.procs.mu.Lock()
	for id, c := range st.Pending {
		r.procs.pending[id] = c
	}
	r.procs.mu.Unlock()
	r.procs.adopt(st.Processes)
	klog.InfoS("Runtime state loaded", "sandboxes", len(st.Sandboxes), "containers", len(st.Containers))
	return nil
}

// processExited: a host process ended (on its own, or stopped), and so did its container.
func (r *cdiRuntime) processExited(id string, code int32) {
	r.RuntimeService.Lock()
	if c, ok := r.RuntimeService.Containers[id]; ok && c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
		c.State = runtimeapi.ContainerState_CONTAINER_EXITED
		c.ExitCode = code
		c.FinishedAt = time.Now().UnixNano()
		c.Reason = map[bool]string{true: "Completed", false: "Error"}[code == 0]
	}
	r.RuntimeService.Unlock()
	r.save()
}

func (r *cdiRuntime) setExit(id string, code int32) {
	r.mu.Lock()
	r.exitCodes[id] = code
	r.mu.Unlock()
}

// inject resolves ids against a fresh scan of the spec directories, as containerd
// refreshes its registry before each injection. A spec file the library rejects does
// not fail injection by itself: its devices are simply unresolvable, and the error
// then names them.
func (r *cdiRuntime) inject(spec *oci.Spec, ids []string) error {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(r.cdiDirs...), cdi.WithAutoRefresh(false))
	if err != nil && cache == nil {
		return err
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		for path, es := range errs {
			for _, e := range es {
				klog.InfoS("CDI spec rejected", "path", path, "err", e)
			}
		}
	}
	if _, err := cache.InjectDevices(spec, ids...); err != nil {
		return err
	}
	return nil
}

func (r *cdiRuntime) write(rec ContainerRecord) error {
	if strings.ContainsAny(rec.PodUID, "/.") || rec.PodUID == "" || strings.ContainsAny(rec.Container, "/") {
		return fmt.Errorf("refusing record path for pod %q container %q", rec.PodUID, rec.Container)
	}
	dir := filepath.Join(r.recordsDir, rec.PodUID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+rec.Container+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, rec.Container+".json"))
}

func podOf(s *runtimeapi.PodSandboxConfig) string {
	return s.GetMetadata().GetNamespace() + "/" + s.GetMetadata().GetName()
}

func fillFromOCI(rec *ContainerRecord, spec *oci.Spec) {
	rec.Env = orEmpty(spec.Process.Env)
	rec.DeviceNodes = []deviceNode{}
	for _, d := range spec.Linux.Devices {
		n := deviceNode{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor, UID: d.UID, GID: d.GID}
		if d.FileMode != nil {
			mode := uint32(*d.FileMode)
			n.FileMode = &mode
		}
		rec.DeviceNodes = append(rec.DeviceNodes, n)
	}
	rec.Mounts = []mount{}
	for _, m := range spec.Mounts {
		rec.Mounts = append(rec.Mounts, mount{HostPath: m.Source, ContainerPath: m.Destination, Options: orEmpty(m.Options), Type: m.Type})
	}
	rec.Hooks = []hook{}
	if h := spec.Hooks; h != nil {
		// The OCI spec keeps hooks per stage; stage order is the only order there is.
		stages := []struct {
			name  string
			hooks []oci.Hook
		}{
			{"prestart", h.Prestart}, //nolint:staticcheck // CDI still injects prestart hooks.
			{"createRuntime", h.CreateRuntime},
			{"createContainer", h.CreateContainer},
			{"startContainer", h.StartContainer},
			{"poststart", h.Poststart},
			{"poststop", h.Poststop},
		}
		for _, st := range stages {
			for _, oh := range st.hooks {
				rec.Hooks = append(rec.Hooks, hook{HookName: st.name, Path: oh.Path, Args: orEmpty(oh.Args), Env: orEmpty(oh.Env), Timeout: oh.Timeout})
			}
		}
	}
}

// orEmpty keeps the JSON shape fixed: [] rather than null for an absent list.
func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
