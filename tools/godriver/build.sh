#!/usr/bin/env bash
# Builds godriver (main.go: a minimal DRA driver on k8s.io/dynamic-resource-allocation's
# kubeletplugin helper, the Go peer of `make bench`); see ../go-binary.sh.
exec bash "$(dirname "$0")/../go-binary.sh" godriver godriver "$(dirname "$0")"
