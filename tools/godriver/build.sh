#!/usr/bin/env bash
# Builds godriver (main.go: a minimal DRA driver on k8s.io/dynamic-resource-allocation's
# kubeletplugin helper, the Go peer of `make bench`) into a cache keyed by this module's
# sources and the Go version, so it is rebuilt only when they change. Progress goes to
# stderr; the last line of stdout is the directory holding the binary.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DRADRIVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dradriver}

if ! command -v go >/dev/null; then
  echo "godriver: go is not installed; cannot build godriver" >&2
  exit 127
fi
key=$( (cd "$here" && cat go.mod go.sum main.go build.sh; go version) | sha256sum | cut -c1-16)
out="$cache/godriver/$key"

if [ -f "$out/.complete" ]; then
  echo "godriver: cached in $out" >&2
  echo "$out"
  exit 0
fi

mkdir -p "$out"
echo "godriver: building into $out" >&2
start=$(date +%s)
# Built under a temporary name and renamed, so a concurrent or interrupted build never
# leaves a half-written binary behind a .complete marker.
tmp="$out/godriver.tmp.$$"
(cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp" .)
mv -f "$tmp" "$out/godriver"
touch "$out/.complete"
find "$cache/godriver" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
echo "godriver: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
