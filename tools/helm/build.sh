#!/usr/bin/env bash
# Builds the helm v3 CLI (pinned in go.mod) into a cache keyed by this module's sources
# and the Go version, so it is rebuilt only when they change. The tests lint and render
# the chart with it; nothing here ships.
# Progress goes to stderr; the last line of stdout is the directory holding the binary.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DRADRIVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dradriver}

if ! command -v go >/dev/null; then
  echo "helm: go is not installed; cannot build helm" >&2
  exit 127
fi
version=$(awk '$1=="helm.sh/helm/v3"{print $2} $1=="require" && $2=="helm.sh/helm/v3"{print $3}' "$here/go.mod" | head -n1)
key=$( (cd "$here" && cat go.mod go.sum tools.go build.sh; go version) | sha256sum | cut -c1-16)
out="$cache/helm/$key"

if [ -f "$out/.complete" ]; then
  echo "helm: $version cached in $out" >&2
  echo "$out"
  exit 0
fi

mkdir -p "$out"
cd "$here"
total=$(go list -deps helm.sh/helm/v3/cmd/helm | wc -l)
echo "helm: building helm $version ($total packages; a cold build takes a few minutes on 2 cores)" >&2
start=$(date +%s)
# `helm version` reports what the linker stamps here, not the module version.
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
# Without these, `helm template` and `helm lint` assume Kubernetes 1.20 (as upstream's
# Makefile does, derive them from the client-go helm is built with: v0.N is 1.N).
client_go=$(go list -m -f '{{.Version}}' k8s.io/client-go)
kminor=${client_go#v0.}; kminor=${kminor%%.*}
for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$kminor"
done
# Build under a temporary name and rename, so an interrupted or concurrent build never
# leaves a half-written binary behind a .complete marker.
tmp="$out/helm.tmp.$$"
# -v names each package as it is compiled: turn that into a running count.
CGO_ENABLED=0 go build -v -trimpath -ldflags "$ldflags" -o "$tmp" helm.sh/helm/v3/cmd/helm 2>&1 |
  awk -v total="$total" -v start="$start" '
    # Package paths have no spaces; anything else is a compiler or go command message.
    / / || /^#/ { print > "/dev/stderr"; next }
    { n++; if (n % 50 == 0 || n == 1) { printf "helm: [%d/~%d] %ds %s\n", n, total, systime()-start, $0 > "/dev/stderr"; fflush("/dev/stderr") } }'
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
  rm -f "$tmp"
  echo "helm: build failed (exit $status)" >&2
  exit "$status"
fi
mv -f "$tmp" "$out/helm"
touch "$out/.complete"
# Older builds are ~60 MB each and nothing refers to them any more.
find "$cache/helm" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
echo "helm: built $version in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
