#!/usr/bin/env bash
# A Docker engine for kind: the one already running, or (as root, where none runs, as on
# this project's CI machines) Debian's docker.io started here with the settings such a VM
# needs. Prints nothing on stdout; says on stderr which engine it uses.
#
# The settings, each found by trying on these machines (see docs/kind.md):
#   cgroupfs driver      the hosts run cgroup v1 without systemd managing it
#   nofile 20000:20000   the host's hard RLIMIT_NOFILE; docker's default asks for more
#   --iptables=false     no NAT is needed: kind nodes talk over the bridge, and builds
#                        that fetch packages use the host's network
#   runc-nosysres        only where the bounding set lacks CAP_SYS_RESOURCE: privileged
#                        containers (every kind node) fail without it
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DRADRIVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dradriver}
log="$cache/kind/dockerd.log"

if docker info >/dev/null 2>&1; then
  echo "engine: using the running Docker engine ($(docker info -f '{{.ServerVersion}}' 2>/dev/null))" >&2
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "engine: no Docker engine answers (docker info failed) and this is not root, so none can be started here; start Docker and rerun" >&2
  exit 1
fi

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v iptables >/dev/null || need+=(iptables)
command -v jq >/dev/null || need+=(jq)
if [ ${#need[@]} -gt 0 ]; then
  echo "engine: installing ${need[*]} from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "${need[@]}" >&2
fi

runtime_flags=()
bnd=$(awk '/^CapBnd:/{print $2}' /proc/self/status)
if (( (16#$bnd >> 24 & 1) == 0 )); then
  install -m 0755 "$here/runc-nosysres" /usr/local/sbin/runc-nosysres
  runtime_flags=(--add-runtime nosysres=/usr/local/sbin/runc-nosysres --default-runtime nosysres)
  echo "engine: this host's capability bounding set lacks CAP_SYS_RESOURCE; containers run through runc-nosysres" >&2
fi
cgroup_driver=cgroupfs
[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && [ -d /run/systemd/system ] && cgroup_driver=systemd

mkdir -p "$(dirname "$log")"
echo "engine: starting dockerd (log: $log)" >&2
# setsid: the engine outlives this script and the make that ran it, as a service would.
setsid dockerd --iptables=false --ip-masq=false \
  --default-ulimit nofile=20000:20000 \
  --exec-opt native.cgroupdriver=$cgroup_driver --storage-driver overlay2 \
  "${runtime_flags[@]}" >"$log" 2>&1 < /dev/null &
for _ in $(seq 60); do
  docker info >/dev/null 2>&1 && { echo "engine: dockerd $(docker info -f '{{.ServerVersion}}') is up" >&2; exit 0; }
  sleep 0.5
done
echo "engine: dockerd did not answer within 30 s; its log ($log) ends:" >&2
tail -n 20 "$log" >&2
exit 1
