# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The execution environment end to end: build it offline, run the upgrade of a lab host inside it with navigator.

    python bench/ee_navigator.py [--baseline] [--rebuild] [--rev REV] [--keep]   figures as JSON, progress on stderr

1. The EE base image, offline (no registry is reachable): debootstrap --variant=minbase bookworm with python3 (3.11),
   python3-pip, openssh-client and ca-certificates from the Debian mirror of this machine's apt configuration (read
   at run time), imported as localhost/gpufleet-ee-base:<recipe hash> and :latest; a hash-tagged image that exists
   is reused (as lab/image.py caches the node image).
2. The EE: ee/execution-environment.yml staged under .lab/ee/stage/ beside collections/ (the collection's tarball
   from ansible-galaxy collection build of `git archive <--rev, default HEAD>`, and ansible.utils copied from the
   tooling venv's ansible bundle: no Galaxy server is reachable), then ansible-builder build with
   EE_BASE_IMAGE=<base>, tagged localhost/gpufleet-ee:<hash of the definition, the base image, the tarball's
   FILES.json and ansible.utils' MANIFEST.json>. The build's pip runs
   with this machine's pip index and CA settings, read at run time (pip config list, PIP_* variables) and mounted
   into every build step as /etc/xdg/pip (nothing of it is written into the project or kept in the image);
   --network=host.
3. A 1-host lab `ee` at the old stack (bench/fleet_scale.fresh_lab), then, from a job folder .lab/ee/job/ that
   holds no collection (its ansible.cfg is the project's without collections_path and roles_path, so the EE's
   installed gpufleet.upgrade and ansible.utils are the ones that run):
     ansible-navigator run gpufleet.upgrade.upgrade --ee true --eei <EE> --ce podman --mode stdout --pae true ...
   with --network=host (the lab hosts, the mirrors and the run's fleet cache are on loopback), the lab's key and
   known_hosts mounted read-only at their paths and the inventory's gpufleet_controller_dir mounted read-write (the
   persistent controller folder of docs/awx.md section 1). Then gpufleet.upgrade.audit --check from the EE too.
   --baseline: the same upgrade on a fresh lab with the tooling venv's ansible-playbook and the same tarball.
4. Figures: image sizes, build times, each run's wall time, tasks per host and status counts from the navigator
   artifact (kept under .lab/ee/artifacts/), the upgrade's report.json outcome and the audit's verdict. The lab goes
   down at the end (--keep leaves it up).

ansible-builder and ansible-navigator live in a private venv .lab/ee/venv (made on first use from the default
index). A bench, not a test: it downloads (Debian packages, the EE's Python packages) when an image is not cached.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import fleet_scale as fs  # noqa: E402
import yaml  # noqa: E402

from lab import image as lab_image  # noqa: E402
from lab import nodes  # noqa: E402
from lab.common import hash_paths, log, podman, podman_env, run  # noqa: E402

EE_DIR = REPO / ".lab" / "ee"
VENV = EE_DIR / "venv"
DEFINITION = REPO / "ee" / "execution-environment.yml"
LAB = "ee"
TOOLS = ["ansible-builder>=3,<4", "ansible-navigator"]

BASE_REPO = "localhost/gpufleet-ee-base"
BASE_SUITE = "bookworm"
BASE_PACKAGES = ["python3", "python3-pip", "openssh-client", "ca-certificates"]
# Bump when the base image's build steps below change.
BASE_REVISION = 1
EE_REPO = "localhost/gpufleet-ee"
GALAXY = REPO / ".venv" / "bin" / "ansible-galaxy"
IN_BUILD_PIP = "/etc/xdg/pip"  # a site-wide pip config folder of Debian's pip: mounted there during the build only


# ---- tools -----------------------------------------------------------------------------------------------------


def tools() -> dict:
    """ansible-builder and ansible-navigator in .lab/ee/venv (installed from the default index when missing)."""
    if not (VENV / "bin" / "ansible-navigator").exists() or not (VENV / "bin" / "ansible-builder").exists():
        log(f"installing {', '.join(TOOLS)} into {VENV}")
        run([sys.executable, "-m", "venv", "--clear", str(VENV)], capture=True)
        run([str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", *TOOLS], capture=True)
    versions = {}
    for tool in ("ansible-builder", "ansible-navigator"):
        out = run([str(VENV / "bin" / tool), "--version"], capture=True).stdout.strip().splitlines()
        versions[tool] = out[0] if out else ""
    return versions


# ---- the base image ----------------------------------------------------------------------------------------------


def base_ref(tag: str | None = None) -> str:
    recipe = f"{BASE_SUITE}|{','.join(BASE_PACKAGES)}|{BASE_REVISION}"
    return f"{BASE_REPO}:{tag or hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def build_base(force: bool = False) -> dict:
    """The EE base image: debootstrap of bookworm with python3, pip and ssh, imported into podman (cached)."""
    ref = base_ref()
    if lab_image.image_exists(ref) and not force:
        podman("tag", ref, base_ref("latest"))
        return build_record(ref)
    rootfs = EE_DIR / f"base-rootfs.tmp-{os.getpid()}"
    t0 = time.monotonic()
    try:
        log(f"debootstrap {BASE_SUITE} into {rootfs}")
        include = f"--include={','.join(BASE_PACKAGES)}"
        mirror = lab_image.debian_mirror()
        run(["debootstrap", "--variant=minbase", include, BASE_SUITE, str(rootfs), mirror], capture=True)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (rootfs / cache).glob("*"):
                if p.is_file():
                    p.unlink()
        changes = ["ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]', f"LABEL gpufleet.ee.base.recipe={ref.rsplit(':', 1)[1]}"]
        imp = " ".join(f"--change '{c}'" for c in changes)
        run(
            ["bash", "-o", "pipefail", "-c", f"tar -C {rootfs} --numeric-owner -c . | podman import {imp} - {ref}"],
            capture=True,
            env=podman_env(),
        )
        podman("tag", ref, base_ref("latest"))
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return build_record(ref, round(time.monotonic() - t0, 1))


def build_record(ref: str, took: float | None = None) -> dict:
    """How long ``ref`` took to build: written when it is built, read back when it is reused from the cache."""
    path = EE_DIR / "builds" / f"{ref.rsplit('/', 1)[-1].replace(':', '-')}.json"
    if took is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"build_s": took, "built": time.strftime("%Y-%m-%d %H:%M:%S %Z")}) + "\n")
    record = json.loads(path.read_text()) if path.exists() else {}
    return {"ref": ref, "cached": took is None, "build_s": record.get("build_s"), "built": record.get("built")}


def image_size(ref: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", ref).stdout.strip())


# ---- the EE ----------------------------------------------------------------------------------------------------


def pip_settings() -> dict:
    """This machine's pip index and CA settings (pip config list, which includes PIP_* variables), read now."""
    out = run([sys.executable, "-m", "pip", "config", "list"], capture=True).stdout
    found: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in ("index-url", "extra-index-url", "cert", "trusted-host", "default-timeout", "timeout"):
            found[name] = value.strip().strip("'\"")
    return found


def pip_build_config(folder: Path) -> Path:
    """A pip.conf (+ the CA bundle it names) for the EE build's steps: this machine's index URLs reachable over the
    network (file:// ones are not, inside the build), and its CA bundle (an egress proxy's CA among them)."""
    got = pip_settings()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    lines = ["[global]"]
    if got.get("index-url"):
        lines.append(f"index-url = {got['index-url']}")
    extra = [u for u in got.get("extra-index-url", "").split() if u.startswith(("http://", "https://"))]
    if extra:
        lines.append(f"extra-index-url = {' '.join(extra)}")
    for name in ("trusted-host", "default-timeout", "timeout"):
        if got.get(name):
            lines.append(f"{name} = {got[name]}")
    ca = Path(got.get("cert") or "/etc/ssl/certs/ca-certificates.crt")
    if ca.is_file():
        shutil.copyfile(ca, folder / "ca.crt")
        lines.append(f"cert = {IN_BUILD_PIP}/ca.crt")
    (folder / "pip.conf").write_text("\n".join(lines) + "\n")
    return folder


def stage(rev: str) -> tuple[Path, str]:
    """ee/execution-environment.yml beside collections/ (the tarball of commit ``rev``, ansible.utils); the EE's
    content hash. The tarball is built from ``git archive rev``: the EE holds a commit, not the working tree."""
    stage_dir = EE_DIR / "stage"
    shutil.rmtree(stage_dir, ignore_errors=True)
    colls = stage_dir / "collections"
    src = stage_dir / "src"
    colls.mkdir(parents=True)
    src.mkdir()
    shutil.copyfile(DEFINITION, stage_dir / DEFINITION.name)
    run(["bash", "-o", "pipefail", "-c", f"git -C {REPO} archive --format=tar {rev} | tar -x -C {src}"], capture=True)
    run([str(GALAXY), "collection", "build", "--output-path", str(colls), str(src)], capture=True, cwd=REPO)
    shutil.rmtree(src)
    tarball = next(colls.glob("gpufleet-upgrade-*.tar.gz"))
    wanted = {c["name"].rsplit("/", 1)[-1] for c in yaml.safe_load(DEFINITION.read_text())["dependencies"]["galaxy"]
              ["collections"]}  # fmt: skip
    if tarball.name not in wanted:
        raise SystemExit(f"{DEFINITION.relative_to(REPO)} does not name {tarball.name} (galaxy.yml's version)")
    utils = ansible_utils_dir()
    shutil.copytree(utils, colls / "ansible.utils", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    with tarfile.open(tarball) as tar:
        files_json = tar.extractfile("FILES.json").read().decode()
    key = hash_paths([DEFINITION], extra=files_json + (utils / "MANIFEST.json").read_text())
    return stage_dir, key


def ansible_utils_dir() -> Path:
    """ansible.utils as the tooling venv's ansible bundle installs it (MANIFEST.json, FILES.json)."""
    out = run([str(GALAXY), "collection", "list", "ansible.utils", "--format", "json"], capture=True, cwd=REPO).stdout
    for root, found in json.loads(out).items():
        if "ansible.utils" in found:
            return Path(root) / "ansible" / "utils"
    raise SystemExit("ansible.utils is not installed in .venv (scripts/setup.sh installs the ansible bundle)")


def build_ee(base: str, rev: str, force: bool = False) -> dict:
    """ansible-builder build of the staged definition on ``base`` (cached by content hash)."""
    stage_dir, key = stage(rev)
    base_id = podman("image", "inspect", "--format", "{{.Id}}", base).stdout.strip()
    ref = f"{EE_REPO}:{hashlib.sha256((key + base_id).encode()).hexdigest()[:12]}"
    if lab_image.image_exists(ref) and not force:
        podman("tag", ref, f"{EE_REPO}:latest")
        return build_record(ref)
    pip_dir = pip_build_config(EE_DIR / "build-pip")
    context = EE_DIR / "context"
    shutil.rmtree(context, ignore_errors=True)
    argv = [str(VENV / "bin" / "ansible-builder"), "build", "-f", str(stage_dir / DEFINITION.name)]
    argv += ["-c", str(context), "-t", ref, "-t", f"{EE_REPO}:latest", "--container-runtime", "podman", "-v", "3"]
    argv += ["--build-arg", f"EE_BASE_IMAGE={base}", *(["--no-cache"] if force else [])]
    argv += ["--extra-build-cli-args", f"--network=host --volume={pip_dir}:{IN_BUILD_PIP}:ro"]
    build_log = EE_DIR / "logs" / "ansible-builder.log"
    build_log.parent.mkdir(parents=True, exist_ok=True)
    log(f"ansible-builder build -> {ref} (log {build_log})")
    t0 = time.monotonic()
    with build_log.open("w") as out:
        rc = subprocess.run(argv, cwd=stage_dir, env=podman_env(), stdout=out, stderr=subprocess.STDOUT).returncode
    took = round(time.monotonic() - t0, 1)
    if rc != 0:
        tail = build_log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"ansible-builder build failed (rc {rc}) after {took} s:\n{tail}")
    return dict(build_record(ref, took), log=str(build_log))


def ee_contents(ref: str) -> dict:
    """ansible-core, ansible-runner, the collections and the Python requirements the EE carries."""
    script = (
        "ansible --version | head -1; python3 --version; ansible-runner --version; "
        "ansible-galaxy collection list --format json 2>/dev/null; "
        "python3 -m pip list --format json 2>/dev/null"
    )
    out = podman("run", "--rm", "--network=host", ref, "bash", "-c", script).stdout.splitlines()
    colls = json.loads(out[3])
    pkgs = {p["name"].lower(): p["version"] for p in json.loads(out[4])}
    return {
        "ansible_core": out[0],
        "python": out[1],
        "ansible_runner": out[2],
        "collections": {name: v["version"] for found in colls.values() for name, v in found.items()},
        "requirements": {n: pkgs.get(n) for n in ("jsonschema", "pyelftools", "packaging", "uv", "pip")},
    }


# ---- the run ---------------------------------------------------------------------------------------------------


def job_dir() -> Path:
    """The navigator's project folder: the project's ansible.cfg without its collection and role paths (the EE's
    installed collections run) and without its default inventory; the lab's profile as a site's own (stacks/lab.yml
    does not ship), found through gpufleet_stack_search_dirs (extravars.json)."""
    job = EE_DIR / "job"
    (job / "stacks").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / "stacks" / "lab.yml", job / "stacks" / "lab.yml")
    (job / "extravars.json").write_text(json.dumps({"gpufleet_stack_search_dirs": [str(job / "stacks")]}) + "\n")
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(REPO / "ansible.cfg")
    for option in ("collections_path", "roles_path", "inventory"):
        cfg.remove_option("defaults", option)
    with (job / "ansible.cfg").open("w") as f:
        f.write("# Written by bench/ee_navigator.py from the project's ansible.cfg.\n")
        cfg.write(f)
    return job


def timed(argv: list[str], name: str, env: dict, cwd: Path) -> dict:
    """Run one playbook command, its output in .lab/ee/logs/<name>.stdout.log: rc, wall, recap, failures."""
    out_log = EE_DIR / "logs" / f"{name}.stdout.log"
    t0 = time.monotonic()
    with out_log.open("w") as out:
        rc = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = round(time.monotonic() - t0, 1)
    text = out_log.read_text(errors="replace")
    row = {"rc": rc, "wall_s": wall, "stdout": str(out_log), "recap": fs.recap(text)}
    if rc != 0:
        row["failures"] = fs.failures(text) or [{"task": "", "message": text[-3000:]}]
    return row


def lab_args() -> list[str]:
    """The lab's inventory and the job's extra vars, for ansible-playbook or ansible-navigator."""
    return ["-i", str(nodes.lab_dir(LAB) / "inventory.yml"), "-e", f"@{job_dir() / 'extravars.json'}"]


def navigator(playbook: str, name: str, image: str, extra: list[str]) -> dict:
    """ansible-navigator run <playbook> in the EE over the lab's inventory: wall, recap and the artifact's figures."""
    inventory = nodes.lab_dir(LAB) / "inventory.yml"
    group_vars = yaml.safe_load(inventory.read_text())["all"]["children"]["gpufleet_lab"]["vars"]
    controller = Path(group_vars["gpufleet_controller_dir"])
    artifact = EE_DIR / "artifacts" / f"{name}.json"
    artifact.parent.mkdir(parents=True, exist_ok=True)
    artifact.unlink(missing_ok=True)
    key = Path(group_vars["ansible_ssh_private_key_file"])
    mounts = [f"{key}:{key}:ro", f"{nodes.known_hosts_path(LAB)}:{nodes.known_hosts_path(LAB)}:ro"]
    mounts.append(f"{controller}:{controller}:rw")
    argv = [str(VENV / "bin" / "ansible-navigator"), "run", playbook, "--ee", "true", "--eei", image]
    argv += ["--ce", "podman", "--pp", "never", "--mode", "stdout", "--pae", "true", "--pas", str(artifact)]
    argv += ["--lf", str(EE_DIR / "logs" / f"navigator-{name}.log"), "--dc", "false", "--co=--network=host"]
    for mount in mounts:
        argv += ["--eev", mount]
    argv += [*lab_args(), *extra]
    # ansible-runner runs podman with --ipc=host, and navigator refuses podman without the host's /dev/mqueue
    # folder (this machine's /dev has none; navigator's own hint is to create it).
    Path("/dev/mqueue").mkdir(exist_ok=True)
    env = dict(podman_env(), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    log(f"ansible-navigator run {playbook} ({name}) in {image}")
    row = {"playbook": playbook, "where": f"EE {image} (ansible-navigator)", **timed(argv, name, env, job_dir())}
    row["artifact"] = str(artifact) if artifact.exists() else None
    if artifact.exists():
        row.update(artifact_figures(json.loads(artifact.read_text())))
    return row


def artifact_figures(data: dict) -> dict:
    """Per host from a navigator playbook artifact: tasks, and how many ended ok, skipped, failed (...) or changed."""
    per_host: dict[str, dict] = {}
    for play in data.get("plays", []):
        for task in play.get("tasks", []):
            counts = per_host.setdefault(task.get("__host") or task.get("host") or "?", {"tasks": 0, "changed": 0})
            counts["tasks"] += 1
            counts["changed"] += task.get("__changed") is True
            result = str(task.get("__result", "unknown")).lower()
            counts[result] = counts.get(result, 0) + 1
    return {"artifact_status": data.get("status"), "tasks_per_host": per_host, "plays": len(data.get("plays", []))}


def newest(controller: Path, pattern: str, since: float) -> dict | None:
    found = [p for p in controller.glob(pattern) if p.stat().st_mtime >= since]
    return json.loads(max(found, key=lambda p: p.stat().st_mtime).read_text()) if found else None


def outside_ee(tarball: Path) -> dict:
    """The baseline: the same upgrade on a fresh lab with the tooling venv's ansible-playbook, no container: the
    same tarball installed into .lab/ee/outside/ (ansible.utils from the venv's ansible bundle, the EE's copy), the
    same job folder, ansible.cfg and extra vars."""
    colls = EE_DIR / "outside" / "collections"
    shutil.rmtree(colls.parent, ignore_errors=True)
    # --force: the project's collections_path (.venv/collections) already holds gpufleet.upgrade 0.2.0 (the checkout).
    run([str(GALAXY), "collection", "install", "--no-deps", "--force", "-p", str(colls), str(tarball)], capture=True)
    lab_up = fs.fresh_lab(LAB, 1)
    env = dict(os.environ, ANSIBLE_CONFIG=str(job_dir() / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(colls))
    env.update(ANSIBLE_NOCOLOR="1", PATH=f"{GALAXY.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    argv = [str(GALAXY.parent / "ansible-playbook"), "gpufleet.upgrade.upgrade", *lab_args()]
    log("ansible-playbook gpufleet.upgrade.upgrade outside the EE")
    row = {"playbook": "gpufleet.upgrade.upgrade", "where": "no EE (ansible-playbook of .venv)", "lab_up_s": lab_up}
    return {**row, **timed(argv, "outside-ee", env, job_dir())}


def everything(keep: bool, rebuild: bool, baseline: bool, rev: str) -> int:
    report: dict = {"command": " ".join(["python", "bench/ee_navigator.py", *sys.argv[1:]]), "rows": []}
    out_file = EE_DIR / f"ee_navigator-{time.strftime('%Y%m%d-%H%M%S')}.json"
    EE_DIR.mkdir(parents=True, exist_ok=True)
    report["tools"] = tools()
    base = build_base(force=rebuild)
    base["size_bytes"] = image_size(base["ref"])
    ee = build_ee(base["ref"], rev, force=rebuild)
    ee["collection_rev"] = run(["git", "-C", str(REPO), "rev-parse", "--short", rev], capture=True).stdout.strip()
    ee["size_bytes"] = image_size(ee["ref"])
    ee["contents"] = ee_contents(ee["ref"])
    report.update(base_image=base, ee_image=ee)
    log(f"base {base['ref']} {base['size_bytes'] / 1e6:.0f} MB, EE {ee['ref']} {ee['size_bytes'] / 1e6:.0f} MB")
    report["lab_up_s"] = fs.fresh_lab(LAB, 1)
    controller = nodes.lab_dir(LAB) / "controller"
    try:
        for playbook, name, extra, pattern in (
            ("gpufleet.upgrade.upgrade", "upgrade", [], "runs/*/report.json"),
            ("gpufleet.upgrade.audit", "audit", ["--check"], "audits/*/report.json"),
        ):
            t0 = time.time()
            row = navigator(playbook, name, ee["ref"], extra)
            rep = newest(controller, pattern, t0)
            row["outcomes"] = {h["host"]: h.get("outcome") for h in (rep or {}).get("hosts", [])}
            report["rows"].append(row)
        if baseline:
            report["rows"].append(
                outside_ee(next((EE_DIR / "stage" / "collections").glob("gpufleet-upgrade-*.tar.gz")))
            )
    finally:
        if not keep:
            nodes.down(LAB)
    upgrade, audit = report["rows"][:2]
    report["verdict"] = {
        "upgraded_in_ee": upgrade["rc"] == 0 and list(upgrade["outcomes"].values()) == ["upgraded"],
        "audit_in_sync": audit["rc"] == 0 and all(o.startswith("in sync") for o in audit["outcomes"].values()),
    }
    fs.finish_report(report, out_file, "ee_navigator", line)
    return 0 if all(report["verdict"].values()) and all(r["rc"] == 0 for r in report["rows"]) else 1


def line(row: dict) -> str:
    tasks = {h: c["tasks"] for h, c in (row.get("tasks_per_host") or {}).items()}
    recap = {h: f"ok={c['ok']} changed={c['changed']} skipped={c['skipped']} failed={c['failed']}"
             for h, c in row.get("recap", {}).items()}  # fmt: skip
    return (
        f"{row['playbook']} in {row['where']}: rc {row['rc']}, wall {row['wall_s']} s, "
        f"artifact tasks per host {tasks}, recap {recap}, "
        f"outcomes {row.get('outcomes')}, artifact {row.get('artifact')}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", action="store_true", help="leave the lab up after the runs")
    ap.add_argument("--rebuild", action="store_true", help="build the base image and the EE again, no layer cache")
    ap.add_argument("--baseline", action="store_true", help="also run the upgrade outside the EE on a fresh lab")
    ap.add_argument("--rev", default="HEAD", help="the commit whose collection the EE holds (default HEAD)")
    args = ap.parse_args(argv)
    return everything(args.keep, args.rebuild, args.baseline, args.rev)


if __name__ == "__main__":
    sys.exit(main())
