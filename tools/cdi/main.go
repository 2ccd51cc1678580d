// Command cdi-resolve resolves CDI device IDs with the same library containerd and
// CRI-O use (tags.cncf.io/container-device-interface/pkg/cdi), so the dradriver
// kubelet simulator can check its pure-Python resolver against the real thing.
//
//	cdi-resolve --spec-dir DIR [--spec-dir DIR2] validate
//	cdi-resolve --spec-dir DIR [--spec-dir DIR2] resolve ID [ID...]
//
// validate prints one line per invalid spec file ("PATH: ERROR") to stderr and exits 1,
// or lists the resolvable devices on stdout and exits 0. resolve prints the container
// edits as JSON, or the injection error on stderr and exits 1. Usage errors exit 2.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

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

type edits struct {
	Env         []string     `json:"env"`
	DeviceNodes []deviceNode `json:"deviceNodes"`
	Mounts      []mount      `json:"mounts"`
	Hooks       []hook       `json:"hooks"`
}

// specDirs collects repeated --spec-dir flags; later directories take priority,
// as in the library.
type specDirs []string

func (d *specDirs) String() string     { return strings.Join(*d, ",") }
func (d *specDirs) Set(v string) error { *d = append(*d, v); return nil }

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("cdi-resolve", flag.ContinueOnError)
	flags.SetOutput(stderr)
	var dirs specDirs
	flags.Var(&dirs, "spec-dir", "CDI spec directory (repeatable; later ones take priority)")
	flags.Usage = func() {
		fmt.Fprintln(stderr, "usage: cdi-resolve --spec-dir DIR [--spec-dir DIR...] validate")
		fmt.Fprintln(stderr, "       cdi-resolve --spec-dir DIR [--spec-dir DIR...] resolve ID [ID...]")
	}
	if err := flags.Parse(args); err != nil {
		return 2
	}
	rest := flags.Args()
	// Without --spec-dir the library would silently read /etc/cdi and /var/run/cdi.
	if len(dirs) == 0 || len(rest) == 0 || (rest[0] == "resolve" && len(rest) < 2) {
		flags.Usage()
		return 2
	}

	// Auto-refresh off: one scan now, and no fsnotify watcher for a short-lived process.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		fmt.Fprintln(stderr, oneLine(err.Error()))
		return 1
	}

	switch rest[0] {
	case "validate":
		if errs := specErrors(cache); len(errs) > 0 {
			for _, line := range errs {
				fmt.Fprintln(stderr, line)
			}
			return 1
		}
		for _, dev := range cache.ListDevices() {
			fmt.Fprintln(stdout, dev)
		}
		return 0
	case "resolve":
		// What a runtime starts from before CDI injection: a process and a Linux section.
		spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
		if _, err := cache.InjectDevices(spec, rest[1:]...); err != nil {
			// containerd's wording; the spec errors say why a device was not found.
			fmt.Fprintf(stderr, "CDI device injection failed: %s\n", oneLine(err.Error()))
			for _, line := range specErrors(cache) {
				fmt.Fprintf(stderr, "CDI spec error: %s\n", line)
			}
			return 1
		}
		out, err := json.Marshal(fromOCI(spec))
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		fmt.Fprintln(stdout, string(out))
		return 0
	default:
		flags.Usage()
		return 2
	}
}

// specErrors returns one "PATH: ERR; ERR" line per spec file the cache rejected.
// Like containerd we do not fail injection for them: a device in a rejected spec is
// simply unresolvable.
func specErrors(cache *cdi.Cache) []string {
	byPath := cache.GetErrors()
	paths := make([]string, 0, len(byPath))
	for path := range byPath {
		paths = append(paths, path)
	}
	sort.Strings(paths)
	lines := make([]string, 0, len(paths))
	for _, path := range paths {
		msgs := make([]string, 0, len(byPath[path]))
		for _, err := range byPath[path] {
			msgs = append(msgs, oneLine(err.Error()))
		}
		lines = append(lines, path+": "+strings.Join(msgs, "; "))
	}
	return lines
}

// oneLine folds the YAML decoder's multi-line errors so each error stays on one line.
func oneLine(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "\n  ", " "), "\n", " ")
}

func fromOCI(spec *oci.Spec) edits {
	e := edits{
		Env:         orEmpty(spec.Process.Env),
		DeviceNodes: []deviceNode{},
		Mounts:      []mount{},
		Hooks:       []hook{},
	}
	for _, d := range spec.Linux.Devices {
		n := deviceNode{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor, UID: d.UID, GID: d.GID}
		if d.FileMode != nil {
			mode := uint32(*d.FileMode)
			n.FileMode = &mode
		}
		e.DeviceNodes = append(e.DeviceNodes, n)
	}
	for _, m := range spec.Mounts {
		e.Mounts = append(e.Mounts, mount{
			HostPath: m.Source, ContainerPath: m.Destination, Options: orEmpty(m.Options), Type: m.Type,
		})
	}
	if h := spec.Hooks; h != nil {
		// The OCI spec keeps hooks per stage, so stage order (the OCI field order) is
		// the only order there is; within a stage they stay in injection order.
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
		for _, stage := range stages {
			for _, oh := range stage.hooks {
				e.Hooks = append(e.Hooks, hook{
					HookName: stage.name, Path: oh.Path, Args: orEmpty(oh.Args),
					Env: orEmpty(oh.Env), Timeout: oh.Timeout,
				})
			}
		}
	}
	return e
}

// orEmpty keeps the JSON shape fixed: [] rather than null for an absent list.
func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
