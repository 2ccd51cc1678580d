#!/usr/bin/env bash
# Builds the real Kubernetes parts the end-to-end tests and `make demo` run, from their
# Go modules, into a cache keyed by what each build depends on:
#
#   build.sh        kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, etcd
#   build.sh node   hollow-node: the kubelet's own code with the DRA manager wired in and
#                   a CRI runtime that resolves CDI (cmd/hollow-node)
#
# K8S=1.34|1.35|1.36|1.37 picks the Kubernetes line (default 1.34, the card's): go.mod
# for 1.34, k8s-<line>.mod (new-line.sh) for the others. Where the kubelet's own API
# moved between lines, the hollow node has a file per side, chosen by the build tags
# since_1_<minor> this script sets for every minor up to the line's.
#
# A target is rebuilt only when its module file, this script or its own cmd/ sources
# change, so editing the hollow node never relinks the control plane. Progress goes to
# stderr; the last line of stdout is the directory holding the binaries.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DRADRIVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dradriver}
target=${1:-controlplane}

if ! command -v go >/dev/null; then
  echo "$target: go is not installed; cannot build Kubernetes from its Go modules" >&2
  exit 127
fi
line=${K8S:-1.34}
lines=$(cd "$here" && ls k8s-1.*.mod | sed -E 's/^k8s-(1\.[0-9]+)\.mod$/\1/' | sort -t. -k2n | tr '\n' ' ')
case "$line" in
  1.34) modfile=go.mod ;;
  *) modfile=k8s-$line.mod ;;
esac
if [[ ! $line =~ ^1\.[0-9]+$ ]] || [ ! -f "$here/$modfile" ]; then
  echo "$target: no Kubernetes line K8S=$line here; the lines are 1.34 $lines" >&2
  exit 2
fi
sumfile=${modfile%.mod}.sum
minor=${line#1.}
tags=""
for ((m = 35; m <= minor; m++)); do tags+=" since_1_$m"; done
tags=${tags# }
k8s_version=$(awk '$1=="k8s.io/kubernetes"{print $2} $1=="require" && $2=="k8s.io/kubernetes"{print $3}' "$here/$modfile" | head -n1)
case "$target" in
  controlplane)
    srcdirs=(cmd/etcd)
    pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler
          k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl ./cmd/etcd)
    bins=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd)
    what="Kubernetes $k8s_version and etcd"
    ;;
  node)
    srcdirs=(cmd/hollow-node)
    pkgs=(./cmd/hollow-node)
    bins=(hollow-node)
    what="the $k8s_version kubelet as a hollow node"
    ;;
  *)
    echo "usage: build.sh [controlplane|node]" >&2
    exit 2
    ;;
esac
key=$( (cd "$here" && cat "$modfile" "$sumfile" build.sh $(find "${srcdirs[@]}" -type f | sort); go version) | sha256sum | cut -c1-16)
out="$cache/$target/$line/$key"

if [ -f "$out/.complete" ]; then
  echo "$target: $what cached in $out" >&2
  echo "$out"
  exit 0
fi

mkdir -p "$out"
cd "$here"
gobuild=(-modfile="$modfile" -tags="$tags")
total=$(go list "${gobuild[@]}" -deps "${pkgs[@]}" | wc -l)
ldflags="-s -w"
# Without these the binaries (and the Node's kubeletVersion) say v0.0.0-master.
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
done
echo "$target: building $what ($total packages; a cold build takes minutes on 2 cores, packages already compiled for another target are reused)" >&2
start=$(date +%s)
# -v names each package as it is compiled: turn that into a running count.
go build "${gobuild[@]}" -v -ldflags "$ldflags" -o "$out/" "${pkgs[@]}" 2>&1 |
  awk -v total="$total" -v start="$start" -v target="$target" '
    # Package paths have no spaces; anything else is a compiler or go command message.
    / / || /^#/ { print > "/dev/stderr"; next }
    { n++; if (n % 25 == 0 || n == 1) { printf "%s: [%d/~%d] %ds %s\n", target, n, total, systime()-start, $0 > "/dev/stderr"; fflush("/dev/stderr") } }'
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
  echo "$target: build failed (exit $status)" >&2
  exit "$status"
fi
for b in "${bins[@]}"; do [ -x "$out/$b" ] || { echo "$target: $b missing after build" >&2; exit 1; }; done
touch "$out/.complete"
# Older builds are hundreds of MB each and nothing refers to them any more.
find "$cache/$target/$line" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
# Builds from before the lines, kept straight under $cache/$target.
find "$cache/$target" -mindepth 1 -maxdepth 1 -type d ! -name '1.*' -exec rm -rf {} +
echo "$target: built in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
