//go:build tools

// Pins nvidia-cdi-hook, built from the same module for the test beds and the image (the
// hooks a CDI spec names must exist on the host that runs them), and nvidia-ctk, whose
// `cdi generate` make gpu-check compares the plugin's spec with on a real GPU; `go mod
// tidy` keeps their dependencies.
package main

import (
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk"
)
