#!/usr/bin/env bash
# Builds kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and
# etcd from their Go modules into a cache keyed by this module's sources, so a
# rebuild happens only when go.mod, go.sum, cmd/ or this script change.
# Prints the directory holding the binaries on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DRADRIVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dradriver}
k8s_version=$(awk '$1=="k8s.io/kubernetes"{print $2} $1=="require" && $2=="k8s.io/kubernetes"{print $3}' "$here/go.mod" | head -n1)
key=$( (cd "$here" && cat go.mod go.sum build.sh $(find cmd -type f | sort); go version) | sha256sum | cut -c1-16)
out="$cache/controlplane/$key"
bins=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd)

if [ -f "$out/.complete" ]; then
  echo "controlplane: $k8s_version binaries cached in $out" >&2
  echo "$out"
  exit 0
fi

mkdir -p "$out"
pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler
      k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl ./cmd/etcd)
cd "$here"
total=$(go list -deps "${pkgs[@]}" | wc -l)
minor=${k8s_version#v1.}; minor=${minor%%.*}
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
done
echo "controlplane: building Kubernetes $k8s_version and etcd ($total packages; a cold build takes tens of minutes on 2 cores)" >&2
start=$(date +%s)
# -v names each package as it is compiled: turn that into a running count.
go build -v -ldflags "$ldflags" -o "$out/" "${pkgs[@]}" 2>&1 |
  awk -v total="$total" -v start="$start" '
    # Package paths have no spaces; anything else is a compiler or go command message.
    / / || /^#/ { print > "/dev/stderr"; next }
    { n++; if (n % 25 == 0 || n == 1) { printf "controlplane: [%d/~%d] %ds %s\n", n, total, systime()-start, $0 > "/dev/stderr"; fflush("/dev/stderr") } }'
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
  echo "controlplane: build failed (exit $status)" >&2
  exit "$status"
fi
for b in "${bins[@]}"; do [ -x "$out/$b" ] || { echo "controlplane: $b missing after build" >&2; exit 1; }; done
touch "$out/.complete"
# Older builds are ~400 MB each and nothing refers to them any more.
find "$cache/controlplane" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
echo "controlplane: built in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
