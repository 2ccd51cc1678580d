//go:build tools

// Package tools pins Kueue, the test-only quota and fair-sharing controller the
// end-to-end tests run against the local control plane (tests/e2e/test_kueue.py).
// build.sh builds its manager from these modules; nothing here ships.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
