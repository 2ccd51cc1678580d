#!/usr/bin/env bash
# make gpu-check: dradriver against the real GPU of this host, read-only
# (devtools/dradriver_dev/gpu_check.py says what it compares). A GPU host lent to a task
# has no network and no Go, so what the check needs beyond the checkout and python3 (>=
# 3.11) is bundled first, on a machine that has them, into build/gpu-check/: pynvml and
# PyYAML from the virtualenv, dradriver-nvcdi and nvidia-ctk from tools/nvcdi. Here:
#   make gpu-check DEVICES=fake:1xH200-141GB     bundles, then checks over a fake
# On the device (the `device` tool), carrying build/gpu-check:
#   make gpu-check OUT=$OUT                      checks, writing gpu-check.md/.json to $OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=build/gpu-check
if [ ! -f "$bundle/.complete" ] || [ -n "${REBUNDLE:-}" ]; then
  tools=$(bash tools/nvcdi/build.sh)
  rm -rf "$bundle"
  mkdir -p "$bundle/bin" "$bundle/site"
  cp "$tools/dradriver-nvcdi" "$tools/nvidia-ctk" "$bundle/bin/"
  .venv/bin/python - "$bundle/site" <<'PY'
import os, shutil, sys
import pynvml, yaml
for mod in (pynvml, yaml):
    src = mod.__file__
    if os.path.basename(src) == "__init__.py":
        shutil.copytree(os.path.dirname(src), os.path.join(sys.argv[1], mod.__name__))
    else:
        shutil.copy2(src, sys.argv[1])
PY
  touch "$bundle/.complete"
  echo "gpu-check: bundled into $bundle ($(du -sh "$bundle" | cut -f1))" >&2
fi
devices=${DEVICES:-nvml}
root=${DRIVER_ROOT:-/}
if [ "$devices" != nvml ] && [ -z "${DRIVER_ROOT:-}" ]; then
  # A fake's driver: laid out as NVIDIA's installer lays one out.
  root=$(PYTHONPATH=$PWD:$PWD/devtools:$PWD/$bundle/site python3 -c \
    'from dradriver_dev.driver_files import fake_driver_root; print(fake_driver_root())')
fi
PYTHONPATH=$PWD:$PWD/devtools:$PWD/$bundle/site exec python3 -m dradriver_dev.gpu_check \
  --devices "$devices" --driver-root "$root" --tools "$bundle/bin" --out "${OUT:-$bundle/out}"
