#!/usr/bin/env bash
# Builds cdi-resolve (the CDI reference resolver, see main.go) into a cache keyed by
# this module's sources and the Go version, so it is rebuilt only when they change.
# Progress goes to stderr; the last line of stdout is the directory holding the binary.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DRADRIVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dradriver}

if ! command -v go >/dev/null; then
  echo "cdi: go is not installed; cannot build cdi-resolve" >&2
  exit 127
fi
key=$( (cd "$here" && cat go.mod go.sum main.go build.sh; go version) | sha256sum | cut -c1-16)
out="$cache/cdi/$key"

if [ -f "$out/.complete" ]; then
  echo "cdi: cdi-resolve cached in $out" >&2
  echo "$out"
  exit 0
fi

mkdir -p "$out"
echo "cdi: building cdi-resolve into $out" >&2
start=$(date +%s)
# Build under a temporary name and rename, so a concurrent build or an interrupted one
# never leaves a half-written binary behind a .complete marker.
tmp="$out/cdi-resolve.tmp.$$"
(cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp" .)
mv -f "$tmp" "$out/cdi-resolve"
touch "$out/.complete"
echo "cdi: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
