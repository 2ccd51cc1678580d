#!/usr/bin/env bash
# Writes the module file of one more Kubernetes line: k8s-<minor>.mod and .sum beside
# go.mod, which build.sh passes to go with -modfile when K8S=<minor> asks for that line.
# go.mod itself stays the card's line (1.34): what an unset K8S builds.
#
#   new-line.sh v1.37.2
#
# k8s.io/kubernetes names its staging modules at v0.0.0 and replaces them with its own
# tree, which a dependent module cannot do: each is replaced here with the release of the
# same minor (v1.37.2 -> v0.37.2), as go.mod does for 1.34. Then `go mod tidy` settles the
# rest. Run again (or edit the .mod by hand) to move a line to a newer patch release.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=${1:?usage: new-line.sh v1.MINOR.PATCH}
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "new-line.sh: $version is not v1.MINOR.PATCH" >&2; exit 2; }
minor=${BASH_REMATCH[1]}
staging_version="v0.$minor.${BASH_REMATCH[2]}"
mod="$here/k8s-1.$minor.mod"
sum="${mod%.mod}.sum"

kube_dir=$(cd "$here" && go mod download -json "k8s.io/kubernetes@$version" | awk -F'"' '/"Dir"/{print $4}')
go_directive=$(awk '$1=="go"{print $2; exit}' "$kube_dir/go.mod")
staging=$(awk '$2=="v0.0.0" && $1 ~ /^k8s\.io\//{print $1}' "$kube_dir/go.mod" | sort -u)

{
  echo "// Kubernetes $version for the local control plane, the hollow node and kind (build.sh"
  echo "// with K8S=1.$minor); written by new-line.sh. go.mod is the card's line, 1.34."
  echo "module github.com/dradriver/dradriver/tools/controlplane"
  echo
  echo "go $go_directive"
  echo
  echo "require ("
  # What the commands import directly, at this line's versions; tidy adds the rest.
  awk '/^require \(/{on=1; next} on && /^\)/{exit} on && $0 !~ /indirect/ {print}' "$here/go.mod" |
    sed -E "s#^(\s+k8s\.io/kubernetes) v[0-9.]+#\1 $version#; s#^(\s+k8s\.io/[a-z-]+) v0\.[0-9]+\.[0-9]+\$#\1 $staging_version#"
  echo ")"
  echo
  for m in $staging; do echo "replace $m => $m $staging_version"; done
} > "$mod"
cp "$here/go.sum" "$sum"
(cd "$here" && go mod tidy -modfile="$mod" >&2)
# The CDI reference library the hollow node resolves devices with: v1.0.1 builds on a
# runtime-tools commit that does not compile against runtime-spec v1.3 (from Kubernetes
# 1.36), and v1.1 drops runtime-tools; containerd 2.2 moved to v1.1 too.
if ! grep -qE 'opencontainers/runtime-spec v1\.[0-2]\.' "$mod"; then
  (cd "$here" && go get -modfile="$mod" tags.cncf.io/container-device-interface@v1.1.2 >&2 &&
    go mod tidy -modfile="$mod" >&2)
fi
echo "$mod"
