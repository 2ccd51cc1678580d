#!/usr/bin/env bash
# Builds the one binary of a Go module under tools/ into a cache keyed by the module's
# sources, this script and the Go version, so it is rebuilt only when they change.
# Usage: go-binary.sh NAME BINARY MODULE_DIR. Progress goes to stderr; the last line of
# stdout is the directory holding the binary.
set -euo pipefail
name=$1 binary=$2 dir=$(cd "$3" && pwd)
self="$(cd "$(dirname "$0")" && pwd)/go-binary.sh"
cache=${DRADRIVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dradriver}

if ! command -v go >/dev/null; then
  echo "$name: go is not installed; cannot build $binary" >&2
  exit 127
fi
key=$( (cd "$dir" && cat go.mod go.sum ./*.go build.sh "$self"; go version) | sha256sum | cut -c1-16)
out="$cache/$name/$key"

if [ -f "$out/.complete" ]; then
  echo "$name: $binary cached in $out" >&2
  echo "$out"
  exit 0
fi

mkdir -p "$out"
echo "$name: building $binary into $out" >&2
start=$(date +%s)
# Built under a temporary name and renamed, so a concurrent or interrupted build never
# leaves a half-written binary behind a .complete marker.
tmp="$out/$binary.tmp.$$"
(cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp" .)
mv -f "$tmp" "$out/$binary"
touch "$out/.complete"
# Older builds of this module go: one per source change would otherwise pile up.
find "$cache/$name" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
echo "$name: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
