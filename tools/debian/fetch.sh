#!/usr/bin/env bash
# Fetches a Debian package of the distribution this machine runs (through apt's own
# sources), with the packages apt would install beside it here (no recommends), and
# unpacks them into a cache keyed by the package and its version, without installing
# anything: the tests run what is in it (prometheus: the dashboard's queries against a real
# Prometheus; chromium: the fleet's page in a real browser). Nothing here ships.
#   tools/debian/fetch.sh PACKAGE
# Progress goes to stderr; the last line of stdout is the unpacked root (usr/... in it).
set -euo pipefail
package=${1:?usage: fetch.sh PACKAGE}
cache=${DRADRIVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dradriver}

if ! command -v apt-get >/dev/null; then
  echo "$package: apt-get is not available; this needs a Debian or Ubuntu machine" >&2
  exit 127
fi
version=$(apt-cache policy "$package" | awk '/Candidate:/ {print $2}')
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
  echo "$package: no such package in apt's sources (run apt-get update?)" >&2
  exit 1
fi
out="$cache/debian/$package/$(printf %s "$version" | tr -c 'A-Za-z0-9.+-' '_')"
if [ -f "$out/.complete" ]; then
  echo "$package: $version cached in $out" >&2
  echo "$out"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# What `apt-get install --no-install-recommends PACKAGE` would install here, by name.
packages=$(apt-get install --dry-run -y --no-install-recommends "$package=$version" 2>/dev/null |
  awk '/^Inst / {print $2}')
echo "$package: fetching Debian's $package $version and $(echo "$packages" | wc -w) packages" >&2
(cd "$work" && apt-get download $packages >/dev/null 2>&1) || {
  echo "$package: apt-get download failed for: $packages" >&2
  exit 1
}
rm -rf "$out"
mkdir -p "$out"
for deb in "$work"/*.deb; do
  dpkg-deb -x "$deb" "$out"
done
touch "$out/.complete"
find "$cache/debian/$package" -mindepth 1 -maxdepth 1 -type d ! -path "$out" -exec rm -rf {} +
echo "$package: $version unpacked into $out" >&2
echo "$out"
