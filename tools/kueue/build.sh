#!/usr/bin/env bash
# Builds Kueue's manager (pinned in go.mod) into a cache keyed by this module's sources
# and the Go version, so it is rebuilt only when they change, and copies its CRDs beside
# it. The end-to-end tests run it against the local control plane (tests/e2e/
# test_kueue.py); nothing here ships.
# Progress goes to stderr; the last line of stdout is the directory holding `kueue` and
# crds/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DRADRIVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dradriver}

if ! command -v go >/dev/null; then
  echo "kueue: go is not installed; cannot build kueue" >&2
  exit 127
fi
version=$(awk '$1=="sigs.k8s.io/kueue"{print $2} $1=="require" && $2=="sigs.k8s.io/kueue"{print $3}' "$here/go.mod" | head -n1)
key=$( (cd "$here" && cat go.mod go.sum tools.go build.sh; go version) | sha256sum | cut -c1-16)
out="$cache/kueue/$key"

if [ -f "$out/.complete" ]; then
  echo "kueue: $version cached in $out" >&2
  echo "$out"
  exit 0
fi

mkdir -p "$out"
cd "$here"
total=$(go list -deps sigs.k8s.io/kueue/cmd/kueue | wc -l)
echo "kueue: building kueue $version ($total packages; a cold build takes several minutes on 2 cores)" >&2
start=$(date +%s)
# What Kueue's own Makefile stamps; `kueue --version`-style logs print it.
ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version"
# Build under a temporary name and rename, so an interrupted or concurrent build never
# leaves a half-written binary behind a .complete marker.
tmp="$out/kueue.tmp.$$"
# -v names each package as it is compiled: turn that into a running count.
CGO_ENABLED=0 go build -v -trimpath -ldflags "$ldflags" -o "$tmp" sigs.k8s.io/kueue/cmd/kueue 2>&1 |
  awk -v total="$total" -v start="$start" '
    # Package paths have no spaces; anything else is a compiler or go command message.
    / / || /^#/ { print > "/dev/stderr"; next }
    { n++; if (n % 100 == 0 || n == 1) { printf "kueue: [%d/~%d] %ds %s\n", n, total, systime()-start, $0 > "/dev/stderr"; fflush("/dev/stderr") } }'
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
  rm -f "$tmp"
  echo "kueue: build failed (exit $status)" >&2
  exit "$status"
fi
# The CRDs of the same release, from the module's own config (what its Helm chart and
# manifests install).
src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
rm -rf "$out/crds"
mkdir -p "$out/crds"
cp "$src"/config/components/crd/bases/*.yaml "$out/crds/"
chmod -R u+w "$out/crds"
mv -f "$tmp" "$out/kueue"
touch "$out/.complete"
# Older builds are large and nothing refers to them any more.
find "$cache/kueue" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
echo "kueue: built $version in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
