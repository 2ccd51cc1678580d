package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

// hostProcs runs the containers of the images named by --exec-image as processes of this
// host, where every other container only pretends to run: the daemons a DRA driver
// starts as pods of its own (MPS, IMEX) must really run for a test to see that they
// outlive the driver's process. A process gets the container's command, its environment
// after CDI and "/" as its directory; volumes are the host's own paths (a driver that
// mounts a host path at the same path sees the same files). It runs in a session of its
// own, so a killed hollow node leaves it running, as containerd's shims outlive the
// kubelet, and a restarted one adopts it by PID and start time (a PID alone may have
// been reused). Its exit is the container's exit; StopContainer sends SIGTERM to its
// process group, then SIGKILL after the grace period.
type hostProcs struct {
	images map[string]bool
	logDir string

	mu      sync.Mutex
	pending map[string]hostCommand // created, not started: container ID -> command
	running map[string]hostProc    // started: container ID -> process
	// exited reports a process's end: the container becomes EXITED with its code.
	exited func(id string, code int32)
}

type hostCommand struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
}

type hostProc struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // /proc/<pid>/stat starttime, in clock ticks since boot
}

func newHostProcs(images []string, logDir string) *hostProcs {
	h := &hostProcs{
		images: map[string]bool{}, logDir: logDir,
		pending: map[string]hostCommand{}, running: map[string]hostProc{},
	}
	for _, i := range images {
		h.images[i] = true
	}
	return h
}

// created remembers the command of a container whose image runs on the host.
func (h *hostProcs) created(id string, cfg *runtimeapi.ContainerConfig, env []string) bool {
	if !h.images[cfg.GetImage().GetImage()] {
		return false
	}
	argv := append(append([]string{}, cfg.GetCommand()...), cfg.GetArgs()...)
	h.mu.Lock()
	h.pending[id] = hostCommand{Argv: argv, Env: env}
	h.mu.Unlock()
	return true
}

// start runs a created container's command; an error fails StartContainer, as a
// runtime's does when the command cannot be executed.
func (h *hostProcs) start(id string) error {
	h.mu.Lock()
	c, ok := h.pending[id]
	delete(h.pending, id)
	h.mu.Unlock()
	if !ok {
		return nil
	}
	if len(c.Argv) == 0 {
		return fmt.Errorf("container %s: an --exec-image container needs a command", id)
	}
	if err := os.MkdirAll(h.logDir, 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(filepath.Join(h.logDir, id+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(c.Argv[0], c.Argv[1:]...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = c.Env, "/", out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %q: %w", c.Argv[0], err)
	}
	p := hostProc{PID: cmd.Process.Pid, Start: startTime(cmd.Process.Pid)}
	h.mu.Lock()
	h.running[id] = p
	h.mu.Unlock()
	klog.InfoS("Container started as a host process", "containerID", id, "pid", p.PID, "command", strings.Join(c.Argv, " "))
	go func() {
		code := int32(0)
		if err := cmd.Wait(); err != nil {
			code = 1
			if ee, ok := err.(*exec.ExitError); ok {
				code = int32(ee.ExitCode())
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					code = 128 + int32(ws.Signal())
				}
			}
		}
		h.ended(id, p, code)
	}()
	return nil
}

// adopt watches the processes a previous run of this node started: gone ones end their
// containers at once, living ones when they exit (not our children: polled).
func (h *hostProcs) adopt(procs map[string]hostProc) {
	for id, p := range procs {
		h.mu.Lock()
		h.running[id] = p
		h.mu.Unlock()
		go func(id string, p hostProc) {
			for alive(p) {
				time.Sleep(200 * time.Millisecond)
			}
			h.ended(id, p, 137) // its code is lost with its parent; SIGKILL's is the likely one
		}(id, p)
	}
}

func (h *hostProcs) ended(id string, p hostProc, code int32) {
	h.mu.Lock()
	cur, ok := h.running[id]
	if ok && cur == p {
		delete(h.running, id)
	}
	h.mu.Unlock()
	if ok && cur == p {
		klog.InfoS("Host process of a container exited", "containerID", id, "pid", p.PID, "exitCode", code)
		h.exited(id, code)
	}
}

// stop ends a container's process: SIGTERM to its process group, SIGKILL after
// `grace` seconds; false if the container has no process here.
func (h *hostProcs) stop(id string, grace int64) bool {
	h.mu.Lock()
	p, ok := h.running[id]
	delete(h.pending, id)
	h.mu.Unlock()
	if !ok {
		return false
	}
	if alive(p) {
		_ = syscall.Kill(-p.PID, syscall.SIGTERM)
	}
	deadline := time.Now().Add(time.Duration(grace) * time.Second)
	for alive(p) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(p) {
		_ = syscall.Kill(-p.PID, syscall.SIGKILL)
		for alive(p) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	return true
}

func (h *hostProcs) forget(id string) {
	h.mu.Lock()
	delete(h.pending, id)
	delete(h.running, id)
	h.mu.Unlock()
}

func (h *hostProcs) snapshot() map[string]hostProc {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]hostProc, len(h.running))
	for id, p := range h.running {
		out[id] = p
	}
	return out
}

// alive: the process exists, is the one started (same start time) and is not a zombie.
func alive(p hostProc) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
	if err != nil {
		return false
	}
	fields := statFields(string(data))
	return len(fields) > 19 && fields[0] != "Z" && fields[19] == strconv.FormatUint(p.Start, 10)
}

func startTime(pid int) uint64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	fields := statFields(string(data))
	if len(fields) <= 19 {
		return 0
	}
	v, _ := strconv.ParseUint(fields[19], 10, 64)
	return v
}

// statFields: the fields of /proc/<pid>/stat after the command name (which may hold
// spaces and parentheses), starting with the state (field 3 of proc(5)); starttime
// (field 22) is then at index 19.
func statFields(stat string) []string {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(stat[i+1:])
}
