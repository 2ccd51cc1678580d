"""Which images a kind cluster runs here, and the driver's own image.

Where a registry answers, the stock kindest/node image (deploy/kind/cluster.yaml) and the
stock Python base (deploy/Dockerfile's default) are used. Where none does (these CI
machines), tools/kind/build.sh builds both from Debian's packages and Go modules, cached
by what they are built from. DRADRIVER_KIND_IMAGES=stock|offline forces a path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dradriver_dev import driver_files

REPO = Path(__file__).resolve().parents[3]
TOOLS = REPO / "tools" / "kind"
STOCK_PYTHON = "python:3.12-slim-bookworm"
IMAGE_REPOSITORY = "dradriver"
LOCAL_CAS = Path("/usr/local/share/ca-certificates")


class KindSetupError(RuntimeError):
    """A step of the kind setup failed; the message names the step and what to do."""


def say(msg: str) -> None:
    print(f"kind: {msg}", flush=True)


def run(
    argv: list[str],
    *,
    what: str,
    timeout: float = 1800,
    quiet: bool = False,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """A command whose failure ends the setup with its own output in the message."""
    t0 = time.monotonic()
    done = subprocess.run(
        argv,
        input=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if not quiet else subprocess.PIPE,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        tail = "\n".join(((done.stdout or "") + (done.stderr or "")).splitlines()[-30:])
        raise KindSetupError(f"{what} failed (exit {done.returncode}): {' '.join(argv)}\n{tail}")
    if not quiet and time.monotonic() - t0 > 20:
        say(f"{what}: {time.monotonic() - t0:.0f}s")
    return done


def build_step(target: str) -> str:
    """tools/kind/build.sh <target>: its progress to our stderr, its result returned."""
    done = subprocess.run(
        ["bash", str(TOOLS / "build.sh"), target], stdout=subprocess.PIPE, text=True
    )
    if done.returncode != 0:
        raise KindSetupError(
            f"building the offline kind part {target!r} failed (exit {done.returncode}); "
            "the lines above say which step; rerun `bash tools/kind/build.sh "
            f"{target}` to retry it alone"
        )
    return done.stdout.strip().splitlines()[-1]


def ensure_engine() -> None:
    done = subprocess.run(["bash", str(TOOLS / "engine.sh")])
    if done.returncode != 0:
        raise KindSetupError("no Docker engine (tools/kind/engine.sh said why above)")


def have_image(image: str) -> bool:
    return (
        subprocess.run(
            ["docker", "image", "inspect", image], capture_output=True, timeout=60
        ).returncode
        == 0
    )


def pull(image: str) -> bool:
    """Whether the image is here or a registry gave it (within two minutes)."""
    if have_image(image):
        return True
    try:
        return (
            subprocess.run(["docker", "pull", "-q", image], capture_output=True, timeout=120)
        ).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@dataclass(frozen=True)
class Images:
    path: str  # "stock" or "offline"
    node: str  # the kind node image every node runs
    python: str  # the driver image's base


def choose(stock_node: str) -> Images:
    forced = os.environ.get("DRADRIVER_KIND_IMAGES", "auto")
    if forced not in ("auto", "stock", "offline"):
        raise KindSetupError(f"DRADRIVER_KIND_IMAGES must be auto, stock or offline, not {forced}")
    if forced != "offline" and pull(stock_node) and pull(STOCK_PYTHON):
        say(f"path: stock images ({stock_node}, {STOCK_PYTHON}): a registry answers")
        return Images("stock", stock_node, STOCK_PYTHON)
    if forced == "stock":
        raise KindSetupError(
            f"DRADRIVER_KIND_IMAGES=stock, but {stock_node} or {STOCK_PYTHON} could not be "
            "pulled; unset it to build them offline"
        )
    say(
        "path: offline images: no registry answers (or DRADRIVER_KIND_IMAGES=offline); "
        "building the node image and the Python base from Debian's packages and Go modules "
        "(cached; tools/kind/build.sh)"
    )
    node = build_step("node")
    python = build_step("python")
    return Images("offline", node, python)


def stage_toolkit() -> None:
    """NVIDIA's toolkit binaries the image carries (tools/nvcdi, built with the host's
    Go and cgo against the same Debian release as the image) into the build context."""
    staged = REPO / "build" / "image-bin"
    staged.mkdir(parents=True, exist_ok=True)
    for name in ("dradriver-nvcdi", "nvidia-cdi-hook"):
        shutil.copy2(driver_files.tools_dir() / name, staged / name)


def build_driver_image(python_base: str, tag: str, *, revision: str = "") -> str:
    """deploy/Dockerfile on the chosen Python base. `revision` changes the image (a label)
    without changing its code: what a `helm upgrade` to a new image needs."""
    image = f"{IMAGE_REPOSITORY}:{tag}"
    stage_toolkit()
    argv = [
        "docker",
        "build",
        "-q",
        "--network",
        "host",
        "--build-arg",
        f"PYTHON={python_base}",
        "-f",
        str(REPO / "deploy" / "Dockerfile"),
        "-t",
        image,
    ]
    if revision:
        argv += ["--label", f"io.dradriver.revision={revision}"]
    extra_ca = extra_ca_certs()
    if extra_ca:
        argv += ["--build-arg", f"EXTRA_CA_CERTS={extra_ca}"]
    t0 = time.monotonic()
    done = subprocess.run([*argv, str(REPO)], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise KindSetupError(f"docker build of {image} failed:\n{tail}")
    say(f"built {image} on {python_base} in {time.monotonic() - t0:.0f}s ({image_size(image)})")
    return image


def extra_ca_certs() -> str:
    """The certificate authorities this machine added to its trust store (Debian's
    /usr/local/share/ca-certificates, or DRADRIVER_BUILD_CA_CERTS naming a PEM file):
    where egress re-signs TLS, pip in the image build needs them to reach PyPI."""
    named = os.environ.get("DRADRIVER_BUILD_CA_CERTS")
    files = [Path(named)] if named else sorted(LOCAL_CAS.glob("*.crt"))
    return "\n".join(f.read_text().strip() for f in files if f.is_file())


def image_size(image: str) -> str:
    done = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Size}}", image], capture_output=True, text=True
    )
    try:
        return f"{int(done.stdout.strip()) / 1e6:.0f} MB"
    except ValueError:
        return "size unknown"


if __name__ == "__main__":  # pragma: no cover - a manual aid
    ensure_engine()
    print(choose(sys.argv[1] if len(sys.argv) > 1 else "kindest/node:v1.37.2"))
