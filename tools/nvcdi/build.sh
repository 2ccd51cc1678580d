#!/usr/bin/env bash
# Builds dradriver-nvcdi (main.go: the driver's files a container needs, as NVIDIA's
# container toolkit v1.20.2 computes them; the image carries it), nvidia-cdi-hook from
# the same module (the hooks its specs name; the image carries it too) and nvidia-ctk
# (make gpu-check compares with its `cdi generate`), into a cache keyed
# by this module's sources and the Go version. All need cgo (NVIDIA's go-nvml does not
# build without it): they link the host's glibc, the same Debian release as the image's.
# Progress goes to stderr; the last line of stdout is the directory holding the binaries.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DRADRIVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dradriver}

if ! command -v go >/dev/null; then
  echo "nvcdi: go is not installed; cannot build dradriver-nvcdi" >&2
  exit 127
fi
key=$( (cd "$here" && cat go.mod go.sum main.go tools.go build.sh; go version) | sha256sum | cut -c1-16)
out="$cache/nvcdi/$key"

if [ -f "$out/.complete" ]; then
  echo "nvcdi: dradriver-nvcdi, nvidia-cdi-hook and nvidia-ctk cached in $out" >&2
  echo "$out"
  exit 0
fi

mkdir -p "$out"
echo "nvcdi: building dradriver-nvcdi, nvidia-cdi-hook and nvidia-ctk into $out" >&2
start=$(date +%s)
# Built into a temporary directory and moved, so a concurrent or interrupted build never
# leaves a half-written binary behind a .complete marker.
tmp=$(mktemp -d "$out/.build.XXXXXX")
(cd "$here" && CGO_ENABLED=1 go build -trimpath -ldflags "-s -w" -o "$tmp/" . \
  github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook \
  github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk)
mv -f "$tmp/nvcdi" "$out/dradriver-nvcdi"
mv -f "$tmp/nvidia-cdi-hook" "$out/nvidia-cdi-hook"
mv -f "$tmp/nvidia-ctk" "$out/nvidia-ctk"
rmdir "$tmp"
touch "$out/.complete"
find "$cache/nvcdi" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
echo "nvcdi: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
