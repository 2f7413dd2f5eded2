# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Node image: a Debian root file system from debootstrap, imported into podman, cached by recipe hash."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

from lab.common import CACHE, IMAGE_REPO, LAB_SRC, hash_paths, log, podman, podman_env, require_root_tools, run

SUITE = "bookworm"
PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-venv",
    "openssh-server",
    "ca-certificates",
    "xz-utils",
    "curl",
    "iproute2",
    "procps",
    # Slurm's node daemon and its authentication (lab/slurm.py starts them on the nodes it puts in a cluster).
    "slurmd",
    "munge",
]
OVERLAY = LAB_SRC / "image" / "files"
SLURM_UNITS = ("munge.service", "slurmd.service")


# Bump when the build steps in this file change in a way that changes the image.
# 2: no SSH host keys in the image (each node gets its own at `lab up`); 3: slurmd and munge disabled, no munge key.
RECIPE_REVISION = 3


def recipe_hash() -> str:
    """Cache key of the image: suite, packages, overlay files and the recipe revision."""
    recipe = f"{SUITE}|{','.join(PACKAGES)}|{RECIPE_REVISION}"
    return hash_paths([OVERLAY], extra=recipe)[:12]


def image_ref(tag: str | None = None) -> str:
    return f"{IMAGE_REPO}:{tag or recipe_hash()}"


def image_exists(ref: str) -> bool:
    return podman("image", "exists", ref, check=False).returncode == 0


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses, read at run time (never written into the project)."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:"):
                uri = line.split(":", 1)[1].split()[0]
                if "security" not in uri:
                    return uri
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            m = re.match(r"deb\s+(\S+)\s+\S+\s+main", line)
            if m and "security" not in m.group(1):
                return m.group(1)
    raise RuntimeError("no Debian mirror found in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list")


def _customize(rootfs: Path) -> None:
    shutil.copytree(OVERLAY, rootfs, dirs_exist_ok=True, symlinks=True)
    # An empty machine-id makes systemd create a fresh one per container, so nodes differ.
    (rootfs / "etc/machine-id").write_text("")
    dbus_id = rootfs / "var/lib/dbus/machine-id"
    if dbus_id.exists() or dbus_id.is_symlink():
        dbus_id.unlink()
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (rootfs / cache).glob("*"):
            if p.is_file():
                p.unlink()
    # No host keys in the image: every node gets its own at `lab up` (lab/nodes.py), pinned in the inventory's
    # known_hosts, as a fleet's hosts each have their own.
    for key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (rootfs / "srv/models").mkdir(parents=True, exist_ok=True)
    # slurmd and munged run only on the nodes `python -m lab.slurm start` puts in a cluster, with the lab's shared
    # munge key: the image starts neither at boot and carries no key of its own (munge's postinst made one).
    for unit in SLURM_UNITS:
        (rootfs / "etc/systemd/system/multi-user.target.wants" / unit).unlink(missing_ok=True)
    (rootfs / "etc/munge/munge.key").unlink(missing_ok=True)


def build_image(force: bool = False) -> str:
    """Build the node image unless the hash-tagged image exists; return its reference."""
    require_root_tools()
    ref = image_ref()
    if image_exists(ref) and not force:
        log(f"image {ref} exists (cache hit)")
        podman("tag", ref, image_ref("latest"))
        return ref
    CACHE.mkdir(parents=True, exist_ok=True)
    rootfs = CACHE / f"rootfs-{recipe_hash()}.tmp-{os.getpid()}"
    t0 = time.monotonic()
    try:
        log(f"debootstrap {SUITE} into {rootfs}")
        run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(rootfs),
                debian_mirror(),
            ],
            capture=True,
        )
        t1 = time.monotonic()
        _customize(rootfs)
        log(f"importing into podman as {ref}")
        tar = f"tar -C {rootfs} --numeric-owner -c . "
        imp = (
            "podman import --change 'CMD [\"/sbin/init\"]' --change 'STOPSIGNAL SIGRTMIN+3' "
            f"--change 'LABEL gpufleet.lab.recipe={recipe_hash()}' - {ref}"
        )
        run(["bash", "-o", "pipefail", "-c", f"{tar} | {imp}"], capture=True, env=podman_env())
        podman("tag", ref, image_ref("latest"))
        log(f"image built: debootstrap {t1 - t0:.0f}s, total {time.monotonic() - t0:.0f}s")
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return ref
