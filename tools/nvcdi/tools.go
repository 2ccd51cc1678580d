//go:build tools

// Pins nvidia-cdi-hook, built from the same module for the test beds (the hooks a CDI
// spec names must exist on the host that runs them); `go mod tidy` keeps its dependencies.
package main

import _ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"
