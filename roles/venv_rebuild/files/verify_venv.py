# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verify a freshly built serving venv before anything switches to it. Runs with the venv's own Python (stdlib only).

Usage: python verify_venv.py SPEC_JSON [UV] -> prints one JSON object; exit 1 when a check fails.
With UV (path of uv), also runs ``uv pip check`` on this venv.
SPEC: {"packages": {name: version}, "imports": [dist], "torch_like": [dist], "cuda_version": "13.0",
       "local_tags": {dist: tag}, "same_version": [[dist, ...]], "overrides": [dist], "gpu_required": bool}
"overrides" names the packages the profile's wheels.overrides pins (uv --override): uv pip check knows no
overrides, so a conflict it reports on such a package is accepted (and listed) when the installed version is the
lock's, which the packages check proves; every other conflict fails.
Besides "imports", every installed distribution with compiled code that requires torch is imported too
(``compiled_extensions_of``): a torchvision built for another torch fails there, not at the server's start.
Some compiled packages (sgl-kernel, flash-mla) link the NVIDIA driver's libcuda.so.1 and cannot be imported where
the driver is not installed. With "gpu_required" false (a host that serves without a GPU) such an import is listed
under checks "not_judged", not failed; with a GPU required it fails, naming the missing driver library. Any other
import error fails.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys


def canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version):
    return version.split("+", 1)[0]


def top_level_modules(dist_name):
    """Import names of a distribution: top_level.txt when the wheel has one, else the RECORD's top entries."""
    dist = md.distribution(dist_name)
    text = dist.read_text("top_level.txt")
    if text:
        return sorted({line.strip() for line in text.splitlines() if line.strip() and not line.startswith("_")})
    names = set()
    for path in dist.files or []:
        parts = path.parts
        if parts[0].endswith((".dist-info", ".data")) or parts[0] in ("__pycache__", "..") or parts[0].startswith("_"):
            continue
        if len(parts) > 1 and parts[-1] == "__init__.py" and len(parts) == 2:
            names.add(parts[0])
        elif len(parts) == 1 and parts[0].endswith(".py"):
            names.add(parts[0][:-3])
    return sorted(names)


def _requires(dist, base):
    """Whether a distribution requires ``base`` outside any extra (an extra's requirement is not installed)."""
    for text in dist.requires or []:
        spec, _sep, marker = text.partition(";")
        if requirement_name(spec) == base and "extra" not in marker:
            return True
    return False


def _has_compiled_code(dist):
    return any(p.name.endswith((".so", ".pyd")) or ".so." in p.name for p in dist.files or [])


def compiled_extensions_of(base="torch"):
    """Installed distributions with compiled code that require ``base``: torchvision, torchaudio, kernel wheels.
    Their C++ was built against one torch; on another one they fail at import ("operator torchvision::nms does not
    exist"), which only importing them shows, whether or not the profile names them."""
    found = set()
    for dist in md.distributions():
        name = canon(dist.metadata["Name"] or "")
        if name and name != base and _requires(dist, base) and _has_compiled_code(dist):
            found.add(name)
    return sorted(found)


# The NVIDIA driver's user-space library, as the dynamic loader names it in the error of a failed import.
_DRIVER_LIBRARY = re.compile(r"\blibcuda\.so(?:\.[0-9]+)*")
NOT_JUDGED = "needs the NVIDIA driver ({}), not judged on this host"


def missing_driver_library(exc):
    """The driver library (``libcuda.so.1``) an import error names, or None when the error is about anything else.

    Only the loader's errors count (ImportError, OSError, also where a package re-raised them): a package that fails
    for another reason fails the venv wherever it runs."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (ImportError, OSError)):
            match = _DRIVER_LIBRARY.search(str(exc))
            if match:
                return match.group(0)
        exc = exc.__cause__ or exc.__context__
    return None


# What a package says when it refuses to load for want of a GPU, on a host with no NVIDIA driver at all (DeepEP:
# "The NVIDIA driver does not expose a usable CUDA device"): judged only where the driver library is absent.
_NEEDS_A_GPU = re.compile(r"NVIDIA driver|CUDA (?:device|driver)|no CUDA GPUs|libcuda", re.IGNORECASE)


def driver_absent(library="libcuda.so.1"):
    """True when this host's loader cannot open the NVIDIA driver's library (a host without a GPU)."""
    try:
        ctypes.CDLL(library)
    except OSError:
        return True
    return False


def judge_import_error(mod, name, exc, gpu_required, why="", no_driver=False):
    """``(failure, not_judged)`` of a failed import: one of them is None. ``no_driver``: the host has no NVIDIA
    driver library at all, so an import error that says it wants the driver or a CUDA device is that, too."""
    said = f"{type(exc).__name__}: {exc}"
    library = missing_driver_library(exc)
    if (
        not library
        and no_driver
        and isinstance(exc, (ImportError, OSError, RuntimeError))
        and _NEEDS_A_GPU.search(said)
    ):
        library = "libcuda.so.1"
    if library and not gpu_required:
        return None, f"{NOT_JUDGED.format(library)} (from {name}: {said})"
    if library:
        return (
            f"import {mod} (from {name}) failed: the NVIDIA driver library {library} is missing on this host, which"
            f" must have a GPU ({said}); fix: install the NVIDIA driver, or set gpufleet_gpu_required false for a"
            " host that serves without a GPU",
            None,
        )
    return f"import {mod} (from {name}{why}) failed: {said}", None


_CONFLICT = re.compile(r"^The package `(?P<by>[^`]+)` requires `(?P<req>[^`]+)`, but `(?P<have>[^`]+)` is installed$")


def requirement_name(text):
    return canon(re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", text).group(1))


def judge_pip_check(out, overridden):
    """(accepted, failing) lines of uv pip check's report: conflicts on overridden packages are accepted."""
    accepted, failing = [], []
    for line in (raw.strip() for raw in out.splitlines()):
        if not line or line.startswith(("Using Python ", "Checked ", "Found ", "Resolved ")):
            continue
        match = _CONFLICT.match(line)
        if match and requirement_name(match["req"]) in overridden:
            accepted.append(line)
        else:
            failing.append(line)
    return accepted, failing


def pip_check(uv):
    """uv pip check of this venv: every requirement of every installed distribution is met."""
    proc = subprocess.run(
        [uv, "pip", "check", "--no-config", "--python", sys.executable], capture_output=True, text=True, check=False
    )
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def main(spec_text, uv=None, answer=None):
    spec = json.loads(spec_text)
    failures, checks = [], {}
    installed = {canon(d.metadata["Name"]): d.version for d in md.distributions()}
    for name, version in spec["packages"].items():
        have = installed.get(canon(name))
        if have != version:
            failures.append(f"{name}: installed {have or 'nothing'}, the lock says {version}")
    checks["packages"] = len(spec["packages"])
    for name, tag in spec.get("local_tags", {}).items():
        have = installed.get(canon(name), "")
        local = have.split("+", 1)[1] if "+" in have else ""
        if local != tag:
            failures.append(f"{name} {have}: CUDA local tag {local or '(none)'!r}, the profile requires {tag!r}")
    modules, not_judged = {}, {}
    no_driver = driver_absent()
    checks["nvidia_driver"] = "absent" if no_driver else "present"
    extensions = [n for n in compiled_extensions_of() if n not in {canon(i) for i in spec.get("imports", [])}]
    checks["torch_extensions"] = extensions
    for name in list(spec.get("imports", [])) + extensions:
        try:
            mods = top_level_modules(name)
        except md.PackageNotFoundError:
            failures.append(f"{name}: not installed")
            continue
        modules[name] = mods
        for mod in mods:
            try:
                importlib.import_module(mod)
            except Exception as exc:  # any import error fails the venv, but a missing driver where none is needed
                why = (
                    ", compiled code that requires torch: it must be built for the torch installed"
                    if name in extensions
                    else ""
                )
                failure, unjudged = judge_import_error(
                    mod, name, exc, spec.get("gpu_required", True), why, no_driver=no_driver
                )
                if failure:
                    failures.append(failure)
                else:
                    not_judged[mod] = unjudged
    checks["not_judged"] = not_judged
    checks["imports"] = modules
    for name in spec.get("torch_like", []):
        # A distribution ships several top-level modules (torch: torch, functorch, torchgen); the ones with a
        # version.cuda say which CUDA it was built for, and at least one must.
        found = {}
        for mod in (m for m in modules.get(name, []) if m not in not_judged):
            try:
                found[mod] = importlib.import_module(f"{mod}.version").cuda
            except (ImportError, AttributeError):
                continue
        if not found and name in modules and not set(modules[name]) & set(not_judged):
            failures.append(f"{name}: none of its modules ({', '.join(modules[name])}) has version.cuda")
        for mod, cuda in found.items():
            checks[f"{mod}.version.cuda"] = cuda
            if spec.get("cuda_version") and cuda != spec["cuda_version"]:
                failures.append(f"{mod}.version.cuda is {cuda!r}, the profile's CUDA is {spec['cuda_version']!r}")
    for group in spec.get("same_version", []):
        versions = {name: installed.get(canon(name)) for name in group}
        if len({public(v) for v in versions.values() if v}) != 1 or not all(versions.values()):
            shown = ", ".join(f"{n} {v}" for n, v in versions.items())
            failures.append(f"same-version group does not match: {shown}")
        checks["same_version"] = [*checks.get("same_version", []), versions]
    if uv:
        rc, out = pip_check(uv)
        checks["pip_check"] = out
        if rc != 0:
            accepted, failing = judge_pip_check(out, {canon(n) for n in spec.get("overrides", [])})
            checks["pip_check_overridden"] = accepted
            if failing or not accepted:
                failures.append(f"uv pip check: {'; '.join(failing) or out}")
    print(
        json.dumps({"ok": not failures, "failures": failures, "checks": checks}, sort_keys=True),
        file=answer or sys.stdout,
    )
    return 0 if not failures else 1


def run_with_clean_stdout(argv):
    """``main`` with file descriptor 1 pointed at stderr while the checks import the venv's packages: what they print
    at import time (sgl_kernel's loader, a C extension's printf) goes to stderr, and stdout carries only the one
    JSON answer, which module venv_build (plugins/module_utils/_venv_host.py) parses."""
    sys.stdout.flush()
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    with answer:
        return main(*argv, answer=answer)


if __name__ == "__main__":
    sys.exit(run_with_clean_stdout(sys.argv[1:3]))
