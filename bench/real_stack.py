# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The real CUDA 13 stack, planned on the default index and installed through upgrade.yml on a lab node.

    CONTAINERS_CONF=lab/containers.conf .venv/bin/python bench/real_stack.py [--profile stacks/cu130-sglang0523.yml]
        [--keep] [--keep-wheels] [--work .lab/realstack]

1. Plan: the profile's wheels planned on the controller by the wheel_plan action (bench/real_stack_plan.yml), against
   the indexes the profile names ("default": this machine's configured index, read by the planner at run time):
   once without fetching (the plan alone: probe, resolve, uv), once filling the wheelhouse (bytes fetched).
2. Install: one lab node (python -m lab up 1 --name realstack, the old lab stack seeded) upgraded by
   playbooks/upgrade.yml with that lock. A lab node has no GPU, no NVIDIA download server and no model, so the
   profile the node is upgraded to is the real one with three sections taken from stacks/lab.yml: cuda (the lab's
   redistributable mirror carries nvcc 13.0 and four more components), gpu (not required) and postcheck; and
   serving runs the lab's SGLang stand-in (lab/wheels/lab-sglang, standard library only, copied to the node and
   put on PYTHONPATH) with the real venv's Python. Its wheels section, hence the lock and the venv, is the real
   profile's. The node gets the profile's Python (3.12) from this machine's own build of it.
3. Measure on the node: the build step's own timing (module venv_build's "seconds"), the venv's size and files, bytecode
   (compileall of site-packages into an empty cache, one worker per core: what --compile-bytecode adds), uv pip
   check, which imports work without a GPU (each in its own process), and the audit (playbooks/audit.yml --check)
   in each verify mode of role assess (assess_venv_verify record, size, none; assess_toolkit_verify sha256 once),
   given the lock. When the upgrade rolled back, --point-current points current at the built venv for the audit
   timings only (its verdict is then drift) and back afterwards.
Prints one JSON document. Removes the node, the wheelhouse and the caches at the end unless --keep/--keep-wheels.

--plan-only runs step 1's plan alone, without fetching, on the profile as it is (its own cuda section, so the lock's
one-CUDA-major rule judges the profile's CUDA): no lab node, no wheelhouse; what it downloads is index pages and
METADATA, and what uv reads of the profile's wheels into its cache.
--default-index-only (with --plan-only) plans, for a machine that reaches the default index alone, a copy of the
profile whose every package comes from the default index without its local tag, less the packages named by --drop
(those the default index does not carry) and with the versions --replace NAME==VERSION gives (for a package whose
profile version is on another index only: it replaces the profile's spec and its override); --allow-stale lets
builds older than the profile's max_age_days through (a profile of an earlier stack). The output lists each change.
It proves that the profile's pins and overrides resolve together and keep one CUDA major; it does not prove that
the other indexes serve the files the profile names.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("CONTAINERS_CONF", str(REPO / "lab" / "containers.conf"))

from bench.venv_rebuild import SERVING, UV, build_steps, task_durations  # noqa: E402
from lab import mirrors, nodes  # noqa: E402
from lab.common import mirror_ports, podman  # noqa: E402
from lab.harness import run_playbook  # noqa: E402

LAB_NAME = "realstack"
PLAN_PLAYBOOK = "bench/real_stack_plan.yml"
PLAN_TASK = "Plan the serving wheels (probe, resolve, lock; fill the wheelhouse when bench_fetch)"
STANDIN_SRC = REPO / "lab" / "wheels" / "lab-sglang" / "src"
STANDIN_DIR = "/opt/gpufleet-bench/lab-sglang"
# The profile's packages and what SGLang's server imports at start that carries compiled code.
IMPORTS = [
    "torch",
    "torchvision",
    "torchaudio",
    "torchcodec",
    "triton",
    "flashinfer",
    "sgl_kernel",
    "sglang",
    "sglang.srt.server_args",
    "sglang.srt.entrypoints.engine",
    "xgrammar",
    "transformers",
    "cuda.bindings.driver",
    "cutlass",
    "deep_gemm",
    "flash_mla",
    "tilelang",
]


def lab_profile(real: Path, out_dir: Path) -> Path:
    """The real profile with the sections a lab node can serve taken from the lab's target profile (see above)."""
    profile = yaml.safe_load(real.read_text())
    lab = yaml.safe_load((REPO / "stacks" / "lab.yml").read_text())
    profile["description"] += " (bench: the lab's toolkit mirror, serving stand-in and postcheck)"
    profile["cuda"], profile["gpu"], profile["postcheck"] = lab["cuda"], lab["gpu"], lab["postcheck"]
    profile["serving"] = {**lab["serving"], "env": {"PYTHONPATH": STANDIN_DIR}}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / real.name
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def host_platform() -> str:
    """The lab node's platform as the planner names it (the node image is this machine's Debian release)."""
    libc = os.confstr("CS_GNU_LIBC_VERSION").split()[-1].split(".")
    return f"{os.uname().machine}-manylinux_{libc[0]}_{libc[1]}"


def plan(profile: Path, controller: Path, env: dict, fetch: bool) -> dict:
    inventory = controller.parent / "localhost.ini"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    summary = controller.parent / "plan.json"
    extra = {
        "gpufleet_stack_profile": str(profile),
        "gpufleet_controller_dir": str(controller),
        "gpufleet_index_urls": {},
        "bench_platform": host_platform(),
        "bench_fetch": fetch,
        "bench_summary": str(summary),
    }
    t0 = time.monotonic()
    res = run_playbook(PLAN_PLAYBOOK, inventory, extra, envvars=env)
    wall = time.monotonic() - t0
    if res.rc != 0:
        raise SystemExit(f"the plan failed:\n{res}")
    out = json.loads(summary.read_text())
    lock = json.loads(Path(out["lock_path"]).read_text())
    fetched = out["fetch"]
    return {
        "wall_s": round(wall, 1),
        "task_s": round(sum(s for t, s in task_durations(res).items() if PLAN_TASK in t), 1),
        "packages": len(lock["packages"]),
        "lock_bytes": sum(e.get("size") or 0 for e in lock["packages"]),
        "index_requests": fetched["requests"],
        "bytes_in": fetched["bytes_in"],
        "wheels_fetched": len(fetched.get("fetched", [])),
        "wheelhouse_bytes": fetched.get("bytes", 0),
        # uv reads the profile packages, given to it as URLs or wheelhouse files, by unpacking the whole wheel.
        # (the planner keeps its uv cache in the controller's cache folder when it has one, else uv's UV_CACHE_DIR)
        "uv_cache_bytes": tree_bytes(controller / "cache" / "uv") or tree_bytes(Path(env["UV_CACHE_DIR"])),
        "lock": lock,
        # The plan's verdicts without the per-candidate lines (every file the indexes list).
        "report": [line for line in out["report"] if not line.startswith("    ")],
    }


def tree_bytes(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=False).stdout.split()
    return int(out[0]) if out else 0


def sh(node: str, cmd: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return nodes.node_exec(node, cmd, check=False, timeout=timeout)


def python_prefix(version: str, given: str | None) -> str:
    """Where this machine's Python of the profile's version lives: --python-prefix, else pyenv's build of it, else
    the python3.X on PATH (a prefix that the node can use as it is: built for this machine's Debian release)."""
    if given:
        return given
    builds = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    python = str(builds[-1]) if builds else shutil.which(f"python{version}")
    if not python:
        raise SystemExit(f"no Python {version} on this machine for the node: pass --python-prefix")
    probe = [python, "-c", "import sys; print(sys.base_prefix)"]
    return subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()


def give_python(node: str, version: str, prefix: str) -> str:
    """The profile's Python on the node: this machine's own build of it, at the same prefix, as /usr/bin/python3.X."""
    sh(node, f"mkdir -p {shlex.quote(str(Path(prefix).parent))}")
    podman("cp", prefix, f"{node}:{prefix}")
    sh(node, f"ln -sf {shlex.quote(prefix)}/bin/python{version} /usr/bin/python{version}")
    sh(node, f"mkdir -p {STANDIN_DIR}")
    podman("cp", f"{STANDIN_SRC}/lab_sglang", f"{node}:{STANDIN_DIR}/lab_sglang")
    return sh(node, f"/usr/bin/python{version} --version").stdout.strip()


def timed_playbook(playbook: str, inventory: str, extra: dict, env: dict, check: bool = False):
    t0 = time.monotonic()
    res = run_playbook(playbook, inventory, extra, check=check, envvars=env)
    return res, round(time.monotonic() - t0, 1)


def venv_figures(node: str, venv: str, bytecode: bool) -> dict:
    size = sh(node, f"du -sb {venv} | cut -f1; find {venv} -type f | wc -l; find {venv} -name '*.py' | wc -l")
    total, files, py = (int(x) for x in size.stdout.split())
    site = f"$(echo {venv}/lib/python3.*/site-packages)"
    compile_cmd = (
        f"p=$(mktemp -d); s=$(date +%s.%N); PYTHONPYCACHEPREFIX=$p {venv}/bin/python -m compileall -q -j 0 {site}"
        ' >/dev/null 2>&1; rc=$?; e=$(date +%s.%N); rm -rf "$p"; python3 -c "print($e - $s, $rc)"'
    )
    secs, rc = sh(node, compile_cmd).stdout.split() if bytecode else ("nan", "-1")
    check = sh(node, f"{UV} pip check --no-config --python {venv}/bin/python")
    return {
        "venv_bytes": total,
        "venv_files": files,
        "py_files": py,
        "bytecode_s": round(float(secs), 1) if bytecode else None,
        "bytecode_rc": int(rc) if bytecode else None,
        "uv_pip_check_rc": check.returncode,
        "uv_pip_check": (check.stdout + check.stderr).strip().splitlines()[-20:],
    }


def imports(node: str, venv: str, modules: list[str]) -> dict:
    out = {}
    for module in modules:
        probe = (
            f"s=$(date +%s.%N); {venv}/bin/python -c {shlex.quote('import ' + module)} >/tmp/imp.out 2>&1; rc=$?;"
            ' e=$(date +%s.%N); python3 -c "print($e - $s, $rc)"; grep -E "Error|error:" /tmp/imp.out | tail -n 3'
        )
        lines = sh(node, probe, timeout=600).stdout.splitlines()
        secs, rc = lines[0].split()
        out[module] = {"ok": rc == "0", "s": round(float(secs), 1), **({"error": lines[1:]} if rc != "0" else {})}
    return out


def audits(inventory: str, extra: dict, env: dict) -> list[dict]:
    """audit.yml --check given the lock, in each venv verify mode (toolkit by stat), and once hashing the toolkit."""
    rows = []
    for venv_mode, toolkit_mode in (("record", "stat"), ("size", "stat"), ("none", "stat"), ("none", "sha256")):
        vars_ = {**extra, "assess_venv_verify": venv_mode, "assess_toolkit_verify": toolkit_mode}
        res, wall = timed_playbook("playbooks/audit.yml", inventory, vars_, env, check=True)
        verdicts = res.audit_reports() if res.rc == 0 else {}
        drift = [d for r in verdicts.values() for d in r.get("drift", [])]
        row = {
            "assess_venv_verify": venv_mode,
            "assess_toolkit_verify": toolkit_mode,
            "wall_s": wall,
            "rc": res.rc,
            "in_sync": [r.get("in_sync") for r in verdicts.values()],
            "drift": drift[:6] + ([f"... {len(drift) - 6} more"] if len(drift) > 6 else []),
        }
        if res.rc != 0:
            row["failed"] = [f"{r.task}: {r.msg}" for rs in res.results.values() for r in rs if r.failed][-2:]
        print(json.dumps({"audit": row}, indent=1), flush=True)
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="stacks/cu130-sglang0523.yml")
    ap.add_argument("--work", default=str(REPO / ".lab" / "realstack-bench"), help="controller dir, caches, profile")
    ap.add_argument(
        "--plan-only", action="store_true", help="plan the profile as it is without fetching, then stop (no lab node)"
    )
    ap.add_argument(
        "--default-index-only",
        action="store_true",
        help="with --plan-only: every package from the default index, without local tags (see above)",
    )
    ap.add_argument("--drop", action="append", default=[], help="with --default-index-only: leave out this package")
    ap.add_argument(
        "--replace", action="append", default=[], help="with --default-index-only: NAME==VERSION for the profile's"
    )
    ap.add_argument(
        "--allow-stale", action="store_true", help="with --default-index-only: set wheels.rules.allow_stale"
    )
    ap.add_argument("--keep", action="store_true", help="leave the node up")
    ap.add_argument("--keep-wheels", action="store_true", help="leave the wheelhouse and the uv cache")
    ap.add_argument("--python-prefix", help="this machine's Python of the profile's version, copied to the node")
    ap.add_argument("--reuse-plan", action="store_true", help="install the lock and wheelhouse an earlier run kept")
    ap.add_argument("--measure-only", action="store_true", help="measure the node an earlier --keep run upgraded")
    ap.add_argument("--no-bytecode", action="store_true", help="leave out the compileall timing")
    ap.add_argument(
        "--point-current",
        action="store_true",
        help="when the upgrade rolled back, point current at the built venv for the audit timings only",
    )
    args = ap.parse_args()

    work = Path(args.work).resolve()
    controller = work / "controller"
    controller.mkdir(parents=True, exist_ok=True)
    env = {"UV_CACHE_DIR": str(work / "uv-cache")}
    real = (REPO / args.profile).resolve()
    if args.plan_only:
        changes = []
        if args.default_index_only:
            real, changes = default_index_only(real, work / "profiles", args.drop, args.replace, args.allow_stale)
        return plan_only(real, controller, env, work, changes)
    profile = lab_profile(real, work / "profiles")
    version = yaml.safe_load(real.read_text())["python"]["version"]
    out: dict = {"profile": str(real.relative_to(REPO)), "platform": host_platform()}
    try:
        if args.reuse_plan or args.measure_only:
            lock = json.loads(Path(json.loads((work / "plan.json").read_text())["lock_path"]).read_text())
        else:
            out["plan"] = {k: v for k, v in plan(profile, controller, env, fetch=False).items() if k != "lock"}
            print(json.dumps({"plan": out["plan"]}, indent=1), flush=True)
            fetched = plan(profile, controller, env, fetch=True)
            lock = fetched.pop("lock")
            out["plan_and_fetch"] = {k: v for k, v in fetched.items() if k != "report"}
            print(json.dumps({"plan_and_fetch": out["plan_and_fetch"]}, indent=1), flush=True)

        ports = mirror_ports()
        mirrors.build()
        mirrors.start(ports)
        lab = nodes.up(1, LAB_NAME, ports)
        node, inventory = lab["nodes"][0], lab["inventory"]
        extra = {
            "gpufleet_stack_profile": str(profile),
            "gpufleet_index_urls": {},
            "gpufleet_controller_dir": str(controller),
            "gpufleet_wheel_lock": lock,
        }
        upgraded = args.measure_only
        if not args.measure_only:
            out["node_python"] = give_python(node, version, python_prefix(version, args.python_prefix))
            out["upgrade"] = upgrade(node, inventory, extra, env, controller)
            print(json.dumps({"upgrade": out["upgrade"]}, indent=1), flush=True)
            upgraded = out["upgrade"]["rc"] == 0
        out["load_avg_5m"] = round(os.getloadavg()[1], 1)
        venv = f"{SERVING}/venvs/{lock['venv_name']}"
        if sh(node, f"test -x {venv}/bin/python").returncode == 0:
            out["venv"] = venv_figures(node, venv, bytecode=not args.no_bytecode)
            print(json.dumps({"venv": out["venv"]}, indent=1), flush=True)
            out["imports_without_gpu"] = imports(node, venv, IMPORTS)
            print(json.dumps({"imports_without_gpu": out["imports_without_gpu"]}, indent=1), flush=True)
            current = sh(node, f"readlink {SERVING}/current").stdout.strip()
            switched = current.rstrip("/").endswith(lock["venv_name"])
            if switched or args.point_current:
                out["audit_current"] = "the upgrade's switch" if switched else "pointed at the venv by the bench"
                sh(node, f"ln -sfn {venv} {SERVING}/current")
                try:
                    out["audit"] = audits(inventory, extra, env)
                finally:
                    sh(node, f"ln -sfn {current} {SERVING}/current")
            else:
                out["audit"] = f"not run: current points at {current}, not at the lock's venv (--point-current)"
        print(json.dumps(out, indent=1, default=str))
        return 0 if upgraded else 1
    finally:
        if not args.keep:
            nodes.down(LAB_NAME)
        if not args.keep_wheels:
            shutil.rmtree(controller / "wheelhouse", ignore_errors=True)
            shutil.rmtree(work / "uv-cache", ignore_errors=True)


def default_index_only(real: Path, out_dir: Path, drop: list, replace: list, allow_stale: bool) -> tuple:
    """(path, changes): the profile with every package from the default index, local tags removed, ``drop`` left out
    (and from the same_version groups), ``replace`` (NAME==VERSION) as the spec and override of NAME."""
    profile = yaml.safe_load(real.read_text())
    wheels = profile["wheels"]
    changes = []
    for item in replace:
        name, _sep, version = item.partition("==")
        for pkg in wheels["packages"]:
            if pkg["name"] == name:
                changes.append(f"{name}: {pkg['spec']} -> =={version}")
                pkg["spec"] = f"=={version}"
        for override in wheels.get("overrides") or []:
            if canonicalize_name(Requirement(override["requirement"]).name) == canonicalize_name(name):
                changes.append(f"override {override['requirement']} -> {item}")
                override["requirement"] = item
    default = [i["name"] for i in wheels["indexes"] if i["url"] == "default"]
    if not default:
        raise SystemExit(f"{real} names no index with url 'default'")
    packages = []
    for pkg in wheels["packages"]:
        if pkg["name"] in drop:
            changes.append(f"{pkg['name']} left out")
            continue
        if pkg["indexes"] != default[:1] or pkg.get("local_tag"):
            tag = f", local tag {pkg['local_tag']} dropped" if pkg.get("local_tag") else ""
            changes.append(f"{pkg['name']}: {pkg['indexes']} -> {default[:1]}{tag}")
        packages.append({**{k: v for k, v in pkg.items() if k != "local_tag"}, "indexes": default[:1]})
    wheels["packages"] = packages
    wheels["indexes"] = [i for i in wheels["indexes"] if i["name"] == default[0]]
    rules = wheels.setdefault("rules", {})
    if allow_stale and not rules.get("allow_stale"):
        changes.append("rules.allow_stale: true")
        rules["allow_stale"] = True
    groups = ([n for n in group if n not in drop] for group in rules.get("same_version") or [])
    rules["same_version"] = [group for group in groups if len(group) > 1]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"default-index-{real.name}"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path, changes


def plan_only(real: Path, controller: Path, env: dict, work: Path, changes: list) -> int:
    """The plan alone of the profile as shipped (or its default-index copy): wall and task time, packages, index
    traffic, the plan's verdicts."""
    shown = real.relative_to(REPO) if real.is_relative_to(REPO) else real
    out: dict = {"profile": str(shown), "platform": host_platform(), "changes_for_default_index": changes}
    try:
        planned = plan(real, controller, env, fetch=False)
    finally:
        shutil.rmtree(work / "uv-cache", ignore_errors=True)
    lock = planned.pop("lock")
    out["plan"] = planned
    out["load_avg_5m"] = round(os.getloadavg()[1], 1)
    out["venv_name"] = lock["venv_name"]
    out["profile_packages"] = {e["name"]: e["version"] for e in lock["packages"] if e["role"] == "profile"}
    out["overrides"] = [o["requirement"] for o in lock.get("overrides", [])]
    print(json.dumps(out, indent=1, default=str))
    return 0


def upgrade(node: str, inventory: str, extra: dict, env: dict, controller: Path) -> dict:
    load_before = os.getloadavg()[1]
    res, wall = timed_playbook("playbooks/upgrade.yml", inventory, extra, env)
    out = {
        "rc": res.rc,
        "wall_s": wall,
        # The machine is shared: its 5-minute load average before and after the upgrade, beside its core count.
        "load_avg_5m": [round(load_before, 1), round(os.getloadavg()[1], 1)],
        "cores": os.cpu_count(),
        "build_steps_s": build_steps(res),
        "top_tasks_s": dict(sorted(task_durations(res).items(), key=lambda kv: -kv[1])[:10]),
    }
    if res.rc != 0:
        out["failed"] = [f"{r.task}: {r.msg}" for r in res.results.get(node, []) if r.failed][-3:]
        out["tail"] = res.stdout[-4000:]
    reports = sorted((controller / "runs").glob(f"*/{node}.json"), key=lambda p: p.stat().st_mtime)
    if reports:
        report = json.loads(reports[-1].read_text())
        out["outcome"] = report.get("outcome")
        out["phases"] = report.get("phases")
    return out


if __name__ == "__main__":
    sys.exit(main())
