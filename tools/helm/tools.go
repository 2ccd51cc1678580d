//go:build tools

// Package tools pins the helm CLI; build.sh builds helm.sh/helm/v3/cmd/helm from this module.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
