#!/usr/bin/env bash
# The parts of an offline kind cluster, each built from Debian's packages and Go modules
# only and cached by what it is built from (a Docker image tag carries its key; binaries
# live under ~/.cache/dradriver/kind):
#
#   build.sh kind     the kind CLI (go install), its directory on the last stdout line
#   build.sh debian   a debootstrapped Debian bookworm as an image (no registry's)
#   build.sh python   the image's Python base: that Debian with Debian's python3
#   build.sh node     the kind node image: Kubernetes of the line K8S names (default:
#                     the newest tools/controlplane builds) from its module file there,
#                     containerd 2 (CDI), kind's own node files; `kind build node-image`
#
# Where a registry answers, none of this is needed: the kind demo uses the stock
# kindest/node and python images instead (dradriver_dev/kind.py decides).
# Progress goes to stderr; the last line of stdout is the result (a path or an image).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${DRADRIVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dradriver}/kind
kind_version=v0.33.0
# Bump a recipe's number when its steps here change: keys name their inputs, not this
# script, so an edit elsewhere in it rebuilds nothing.
debian_recipe=2
node_recipe=3
mkdir -p "$cache"
cp_dir="$repo/tools/controlplane"
newest=$(cd "$cp_dir" && ls k8s-1.*.mod | sed -E 's/^k8s-(1\.[0-9]+)\.mod$/\1/' | sort -t. -k2n | tail -n1)
line=${K8S:-$newest}
case "$line" in
  1.34) modfile=go.mod ;;
  *) modfile=k8s-$line.mod ;;
esac
[ -f "$cp_dir/$modfile" ] || { echo "kind-build: no Kubernetes line K8S=$line in $cp_dir" >&2; exit 2; }

say() { echo "kind-build: $*" >&2; }
key_of() { (cat "$@"; go version; echo "$kind_version") | sha256sum | cut -c1-16; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }
# Older builds of an image are hundreds of MB and nothing refers to them any more (an
# image another still builds on is refused by docker and stays).
prune_others() {
  local keep=$1 repo=${1%:*}
  docker images --format '{{.Repository}}:{{.Tag}}' "$repo" | grep -vx "$keep" \
    | xargs -r docker rmi >/dev/null 2>&1 || true
}
# The apt mirror this machine is configured with (deb822 or one-line sources).
mirror() {
  local m
  m=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1)
  [ -n "$m" ] || m=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}' | grep -v security | head -n1)
  echo "${m:-http://deb.debian.org/debian}"
}
# Runs a step and says how long it took; its exit status is the step's.
timed() { local t0=$SECONDS rc=0; "$@" || rc=$?; say "  ... $(( SECONDS - t0 ))s"; return $rc; }

# A step whose output goes to a log (shown when it fails).
quietly() { local log=$1; shift; "$@" >"$log" 2>&1; }

build_kind() {
  local dir="$cache/bin/kind-$kind_version"
  if [ ! -x "$dir/kind" ]; then
    say "building kind $kind_version from its Go module"
    mkdir -p "$dir"
    timed env GOBIN="$dir" GOFLAGS=-mod=mod go install "sigs.k8s.io/kind@$kind_version" >&2
  fi
  echo "$dir"
}

build_debian() {
  local key image rootfs
  key=$(echo "bookworm minbase $(mirror) recipe $debian_recipe" | key_of -)
  image="dradriver-kind/debian:bookworm-$key"
  if ! have_image "$image"; then
    say "debootstrapping Debian bookworm (minbase) from $(mirror)"
    rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
    timed quietly "$cache/debootstrap.log" debootstrap --variant=minbase bookworm "$rootfs" "$(mirror)" \
      || { tail -n 20 "$cache/debootstrap.log" >&2; rm -rf "$rootfs"; exit 1; }
    # debootstrap leaves the downloaded packages behind: 80 MB nothing needs.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import - "$image" >/dev/null
    rm -rf "$rootfs"
    prune_others "$image"
  fi
  echo "$image"
}

build_python() {
  local debian key image
  debian=$(build_debian | tail -n1)
  key=$(echo "$debian" | key_of "$here/python.Dockerfile" -)
  image="dradriver-kind/python:3-bookworm-$key"
  if ! have_image "$image"; then
    say "building the Python base image from Debian's python3"
    timed docker build -q --network host --build-arg DEBIAN="$debian" -t "$image" \
      -f "$here/python.Dockerfile" "$here" >/dev/null
    prune_others "$image"
  fi
  echo "$image"
}

# containerd, ctr and the runc shim, static (no cgo: no btrfs/devmapper snapshotters,
# which kind does not use).
build_containerd() {
  local key dir
  key=$(key_of "$here/containerd/go.mod" "$here/containerd/go.sum")
  dir="$cache/bin/containerd-$key"
  if [ ! -x "$dir/containerd-shim-runc-v2" ]; then
    say "building containerd 2 from its Go module"
    mkdir -p "$dir"
    (cd "$here/containerd" && timed env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
      -tags "no_btrfs no_devmapper no_zfs no_aufs" -o "$dir/" \
      github.com/containerd/containerd/v2/cmd/containerd \
      github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
      github.com/containerd/containerd/v2/cmd/ctr >&2) || { rm -rf "$dir"; exit 1; }
  fi
  echo "$dir"
}

# kubelet, kubeadm and kube-proxy from the line's module file in tools/controlplane (one
# Kubernetes version for the local control plane, the hollow node and kind), with the
# version stamped as the control plane's build stamps it, and its cgo setting (the
# default): the packages the hollow node compiled are reused from Go's cache. The node
# image is the same Debian release as these machines, so the glibc they link to is there.
build_kube_bins() {
  local cp="$cp_dir" key dir version minor ldflags p
  key=$(key_of "$cp/$modfile" "$cp/${modfile%.mod}.sum")
  dir="$cache/bin/kube-$key"
  if [ ! -x "$dir/kube-proxy" ]; then
    version=$(awk '$1=="k8s.io/kubernetes"{print $2} $1=="require" && $2=="k8s.io/kubernetes"{print $3}' "$cp/$modfile" | head -n1)
    minor=${version#v1.}; minor=${minor%%.*}
    ldflags="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    done
    say "building kubelet, kubeadm and kube-proxy $version (shares the control plane's Go build cache)"
    mkdir -p "$dir"
    (cd "$cp" && timed go build -modfile="$modfile" -ldflags "$ldflags" -o "$dir/" \
      k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubeadm k8s.io/kubernetes/cmd/kube-proxy >&2) \
      || { rm -rf "$dir"; exit 1; }
    echo "$version" > "$dir/version"
  fi
  echo "$dir"
}

# The pause container, compiled from the Kubernetes source's own pause.c.
build_pause() {
  local src dir
  src="$(go env GOMODCACHE)/k8s.io/kubernetes@$(cat "$(build_kube_bins | tail -n1)/version")/build/pause/linux/pause.c"
  dir="$cache/bin/pause-$(key_of "$src")"
  if [ ! -x "$dir/pause" ]; then
    mkdir -p "$dir"
    gcc -Os -static -o "$dir/pause" "$src" >&2
    strip "$dir/pause"
  fi
  echo "$dir"
}

# One image per control-plane binary, as a Kubernetes release tarball carries them: the
# binary on the debootstrapped Debian (kube-proxy with the iptables it drives).
image_of_binary() {
  local debian=$1 tag=$2 bin=$3 extra=${4:-} ctx
  ctx=$(mktemp -d "$cache/ctx.XXXXXX")
  cp "$bin" "$ctx/"
  {
    echo "FROM $debian"
    [ -z "$extra" ] || echo "RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $extra && apt-get clean && rm -rf /var/lib/apt/lists/*"
    echo "COPY $(basename "$bin") /usr/local/bin/"
    echo "ENTRYPOINT [\"/usr/local/bin/$(basename "$bin")\"]"
  } > "$ctx/Dockerfile"
  docker build -q --network host -t "$tag" "$ctx" >/dev/null
  rm -rf "$ctx"
}

build_node() {
  local kind_dir debian ctrd kube cp etcd_dir pause key image base_image version tarball stage
  kind_dir=$(build_kind | tail -n1)
  debian=$(build_debian | tail -n1)
  ctrd=$(build_containerd | tail -n1)
  kube=$(build_kube_bins | tail -n1)
  version=$(cat "$kube/version")
  cp=$(K8S=$line bash "$repo/tools/controlplane/build.sh" | tail -n1)
  pause=$(build_pause | tail -n1)
  key=$(echo "$debian $ctrd $kube $cp $pause recipe $node_recipe" | key_of "$here/node/base.Dockerfile" "$here/node/ctr-offline" -)
  image="dradriver-kind/node:$version-$key"
  if have_image "$image"; then echo "$image"; return; fi

  base_image="dradriver-kind/node-base:$key"
  if ! have_image "$base_image"; then
    say "building the node base image (kind's node files, Debian's systemd and runc, containerd 2)"
    stage=$(mktemp -d "$cache/ctx.XXXXXX")
    cp -r "$(go env GOMODCACHE)/sigs.k8s.io/kind@$kind_version/images/base/files" "$stage/files"
    chmod -R u+w "$stage/files"
    mkdir "$stage/containerd"
    cp "$ctrd/containerd" "$ctrd/containerd-shim-runc-v2" "$ctrd/ctr" "$stage/containerd/"
    cp "$here/node/ctr-offline" "$stage/"
    timed docker build -q --network host --build-arg DEBIAN="$debian" -t "$base_image" \
      -f "$here/node/base.Dockerfile" "$stage" >/dev/null
    rm -rf "$stage"
  fi

  say "making a Kubernetes $version server tarball (binaries, image archives) for kind"
  stage=$(mktemp -d "$cache/ctx.XXXXXX")
  mkdir -p "$stage/kubernetes/server/bin"
  echo "$version" > "$stage/kubernetes/version"
  cp "$kube/kubelet" "$kube/kubeadm" "$cp/kubectl" "$stage/kubernetes/server/bin/"
  image_of_binary "$debian" "registry.k8s.io/kube-apiserver-amd64:$version" "$cp/kube-apiserver"
  image_of_binary "$debian" "registry.k8s.io/kube-controller-manager-amd64:$version" "$cp/kube-controller-manager"
  image_of_binary "$debian" "registry.k8s.io/kube-scheduler-amd64:$version" "$cp/kube-scheduler"
  image_of_binary "$debian" "registry.k8s.io/kube-proxy-amd64:$version" "$kube/kube-proxy" "iptables conntrack"
  # kubeadm runs etcd and the sandbox under the tags it pins; etcd is the version
  # tools/controlplane builds, tagged as kubeadm expects it.
  local etcd_tag pause_tags
  etcd_tag=$("$kube/kubeadm" config images list --kubernetes-version "$version" 2>/dev/null | grep /etcd: | head -n1)
  image_of_binary "$debian" "$etcd_tag" "$cp/etcd"
  pause_tags=$( ( "$kube/kubeadm" config images list --kubernetes-version "$version" 2>/dev/null | grep /pause:
                  grep -ho 'registry.k8s.io/pause:[0-9.]*' "$(go env GOMODCACHE)/sigs.k8s.io/kind@$kind_version/images/base/files/etc/containerd/config.toml") | sort -u)
  # pause is static: nothing under it.
  image_of_binary scratch "dradriver-kind/pause:$key" "$pause/pause"
  for t in $pause_tags; do docker tag "dradriver-kind/pause:$key" "$t"; done
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    docker save -o "$stage/kubernetes/server/bin/$c.tar" "registry.k8s.io/$c-amd64:$version"
  done
  # kind imports four archives; the extra images ride with kube-proxy's. kind renames
  # an archive's -amd64 image only when it is the archive's first manifest entry, and
  # how `docker save` orders several images differs between Docker releases (28's put
  # etcd first: kube-proxy kept its -amd64 name, kubeadm's DaemonSet could not find it
  # and, with no registry, no node had a Service network). So kube-proxy also travels
  # under the name kubeadm asks for.
  docker tag "registry.k8s.io/kube-proxy-amd64:$version" "registry.k8s.io/kube-proxy:$version"
  # shellcheck disable=SC2086
  docker save -o "$stage/kubernetes/server/bin/kube-proxy.tar" "registry.k8s.io/kube-proxy-amd64:$version" \
    "registry.k8s.io/kube-proxy:$version" "$etcd_tag" $pause_tags
  tarball="$cache/kubernetes-server-linux-amd64.tar.gz"
  tar -C "$stage" -czf "$tarball" kubernetes
  rm -rf "$stage"

  say "kind build node-image from the tarball"
  timed "$kind_dir/kind" build node-image --type file "$tarball" --base-image "$base_image" \
    --image "$image.build" >&2
  # Put the real ctr back: ctr-offline was for the build only.
  stage=$(mktemp -d "$cache/ctx.XXXXXX")
  printf 'FROM %s\nRUN mv /usr/local/bin/ctr.real /usr/local/bin/ctr\n' "$image.build" > "$stage/Dockerfile"
  docker build -q -t "$image" "$stage" >/dev/null
  rm -rf "$stage" "$tarball"
  docker rmi "$image.build" >/dev/null
  prune_others "$image"
  prune_others "$base_image"
  echo "$image"
}

case "${1:-}" in
  kind) build_kind ;;
  debian) build_debian ;;
  python) build_python ;;
  node) build_node ;;
  *) echo "usage: build.sh kind|debian|python|node" >&2; exit 2 ;;
esac
