// Command dradriver-nvcdi prints, as CDI containerEdits JSON, what a container needs of the
// NVIDIA driver installed under a driver root: its user-space libraries, binaries, GSP
// firmware, IPC sockets, config files and the hooks that create the driver's symlinks and
// update the container's ld cache. NVIDIA's container toolkit computes them (its nvcdi
// package, the code behind `nvidia-ctk cdi generate` and NVIDIA's DRA driver): nothing
// here lists a library name. It touches no GPU and loads no NVML: the driver version comes
// from the caller (the plugin read it through NVML), so a host with two installed
// versions is never guessed at, and a node without GPUs (a fake driver root) works alike.
//
//	dradriver-nvcdi --driver-root DIR --driver-version X.Y.Z [--host-driver-root DIR]
//	                [--dev-root DIR] [--hook-path PATH] [--v]
//
// Paths in the output are the host's (--host-driver-root replaces --driver-root in each
// host path): the container runtime reads the spec on the host, while this process may see
// the driver root elsewhere (the plugin's pod mounts it at /driver-root).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	nvmlmock "github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	"github.com/sirupsen/logrus"
	"tags.cncf.io/container-device-interface/specs-go"
)

func main() {
	fs := flag.NewFlagSet("dradriver-nvcdi", flag.ContinueOnError)
	driverRoot := fs.String("driver-root", "/", "the driver's root as this process sees it")
	hostRoot := fs.String("host-driver-root", "", "the same root as the host sees it (default: --driver-root)")
	devRoot := fs.String("dev-root", "", "the root holding dev/ (default: --driver-root)")
	hookPath := fs.String("hook-path", "/usr/bin/nvidia-cdi-hook", "nvidia-cdi-hook's path on the host, as the runtime runs it")
	version := fs.String("driver-version", "", "the driver's version, as NVML reports it (required)")
	verbose := fs.Bool("v", false, "log what nvcdi found and skipped, to stderr")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *version == "" {
		fail(2, "--driver-version is required")
	}
	edits, err := commonEdits(*driverRoot, *hostRoot, *devRoot, *hookPath, *version, *verbose)
	if err != nil {
		fail(1, err.Error())
	}
	if err := json.NewEncoder(os.Stdout).Encode(edits); err != nil {
		fail(1, err.Error())
	}
}

func commonEdits(driverRoot, hostRoot, devRoot, hookPath, version string, verbose bool) (*specs.ContainerEdits, error) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	if verbose {
		log.SetOutput(os.Stderr)
	}
	// nvcdi asks NVML only for the driver version here; these three calls are all it
	// makes (an unset function of the mock would panic, so a new call shows at once).
	lib := &nvmlmock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return version, nvml.SUCCESS },
	}
	cdi, err := nvcdi.New(
		nvcdi.WithLogger(log),
		// Not auto, which probes for NVML; nvml mode's common edits are the driver's files.
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithDriverRoot(driverRoot),
		nvcdi.WithDevRoot(devRoot),
		nvcdi.WithNVIDIACDIHookPath(hookPath),
		nvcdi.WithNvmlLib(lib),
		// Else nvcdi dlopens the node's libnvidia-sandboxutils into this process.
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
	)
	if err != nil {
		return nil, fmt.Errorf("nvcdi: %w", err)
	}
	edits, err := cdi.GetCommonEdits()
	if err != nil {
		return nil, fmt.Errorf("the driver's files under %s: %w", driverRoot, err)
	}
	spec := &specs.Spec{ContainerEdits: *edits.ContainerEdits}
	if hostRoot != "" && hostRoot != driverRoot {
		t := root.New(root.WithRoot(driverRoot), root.WithTargetRoot(hostRoot), root.WithRelativeTo("host"))
		if err := t.Transform(spec); err != nil {
			return nil, fmt.Errorf("host paths under %s: %w", hostRoot, err)
		}
	}
	return &spec.ContainerEdits, nil
}

func fail(code int, msg string) {
	fmt.Fprintln(os.Stderr, "dradriver-nvcdi:", msg)
	os.Exit(code)
}
