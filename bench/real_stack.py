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

--hosts N runs the lock-file flow instead, as an operator runs it (make bench-real-stack; not in CI):
1. N lab nodes (lab realstack, the old lab stack seeded, the profile's Python given as above), a fresh controller
   folder and a real nginx site cache over it (lab/site_cache.py, cold). 2. playbooks/plan.yml over the N hosts writes
   the lock file of the profile (its lab copy: the shipped wheels section, the lab's cuda/gpu/postcheck/serving) on
   the default index, the wheels fetched once into the controller's wheelhouse (the site cache's origin).
3. playbooks/upgrade.yml -e gpufleet_lock_file=... upgrades the N hosts in one batch, every wheel and toolkit archive
   pulled through the site cache (gpufleet_fleet_cache_url). 4. Measured: upstream bytes (the origin's log: what left
   the controller's wheelhouse for the cache; the wheelhouse's bytes: what the default index sent once), bytes each
   host pulled, the build's steps per host, venv size on disk against the lock's installed sizes and the disk gate's
   estimate, bytecode (compileall into an empty cache), import time of torch and sglang, the site cache's hit rate.
   Imports that need libcuda.so.1 (the driver; a lab node has none) are judged again with NVIDIA's stub libcuda.so
   (the CUDA toolkit's targets/*/lib/stubs/libcuda.so, which answers every call CUDA_ERROR_STUB_LIBRARY): --stub PATH,
   else the first wheel of the controller's wheelhouse that carries one. 5. audit.yml --check over the N hosts
   (every host in sync), rollback.yml of the last host, audit again. 6. On the rolled-back host, the same lock built
   twice more from the host's wheelhouse with empty tool caches: the role (venv_rebuild, given the lock, no switch)
   and ansible.builtin.pip (tests/integration/playbooks/venv_bench_pip.yml). If the disk would fall under 10 GB free,
   it takes fewer hosts and says so. The heavy steps run at nice 10 (the node containers' processes reniced).
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
from lab import site_cache as sc  # noqa: E402
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
    # The real profile's health wait, not the lab's 60 s: the stand-in starts on the real venv's Python, which took
    # 85 s on a 2-core machine at load 15 (three hosts restarting at once) and rolled every host back.
    health = (profile.get("serving") or {}).get("health_timeout_s", 600)
    profile["serving"] = {**lab["serving"], "env": {"PYTHONPATH": STANDIN_DIR}, "health_timeout_s": health}
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


def timed_playbook(
    playbook: str, inventory: str, extra: dict, env: dict, check: bool = False, limit: str | None = None
):
    t0 = time.monotonic()
    res = run_playbook(playbook, inventory, extra, check=check, diff=check, limit=limit, envvars=env)
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
    ap.add_argument("--hosts", type=int, help="the lock-file flow over N lab hosts through a site cache (see above)")
    ap.add_argument("--stub", help="with --hosts: NVIDIA's stub libcuda.so to judge driver imports with")
    ap.add_argument("--no-compare", action="store_true", help="with --hosts: leave out the role/pip build timings")
    args = ap.parse_args()

    work = Path(args.work).resolve()
    controller = work / "controller"
    controller.mkdir(parents=True, exist_ok=True)
    env = {"UV_CACHE_DIR": str(work / "uv-cache")}
    real = (REPO / args.profile).resolve()
    if args.hosts:
        return fleet(args, real, work, env)
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


# --- --hosts N: the lock-file flow through a site cache ------------------------------------------------------------

GB = 1e9
SPACE_FACTOR = 1.5  # role preflight's preflight_space_factor default
FREE_FLOOR = 10 * GB  # the bench takes fewer hosts rather than leave this machine less free disk than this
BUILD_TASK = "Pull the locked wheels, build the new venv and verify it"
ROLE_BUILD_PLAYBOOK = "bench/real_stack_build.yml"
PIP_PLAYBOOK = "tests/integration/playbooks/venv_bench_pip.yml"
PIP_TASK = "Install the lock with ansible.builtin.pip"
PIP_MODULE_PY = "/opt/gpufleet/bench-ansible-py"
STUB_DIR = "/opt/gpufleet-bench/libcuda-stub"
VERIFIER = REPO / "roles" / "venv_rebuild" / "files" / "verify_venv.py"


def renice(hosts: list[str], niceness: int = 10) -> list[int]:
    """Renice every process of the nodes' containers (their sshd: the sessions Ansible opens inherit it), so the
    heavy host steps run at the bench's nice on this shared machine. Only this lab's containers are touched."""
    pids = []
    table = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True, check=True).stdout
    children: dict[int, list[int]] = {}
    for line in table.splitlines():
        pid, ppid = (int(x) for x in line.split())
        children.setdefault(ppid, []).append(pid)
    for host in hosts:
        root = int(podman("inspect", "-f", "{{.State.Pid}}", host, capture=True).stdout.strip())
        todo = [root]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            todo += children.get(pid, [])
    subprocess.run(["renice", "-n", str(niceness), "-p", *map(str, pids)], capture_output=True, check=False)
    return pids


def host_task_s(res, task: str, host: str) -> float:
    """Seconds ``host`` spent in the tasks named ``task`` (ansible-runner's per-task durations)."""
    total = 0.0
    for ev in res.events:
        data = ev.get("event_data", {})
        if ev.get("event", "").startswith("runner_on_") and data.get("host") == host and task in data.get("task", ""):
            total += float(data.get("duration") or 0)
    return round(total, 1)


def lock_entry(lock_file: Path) -> dict:
    doc = yaml.safe_load(lock_file.read_text())
    if len(doc["entries"]) != 1:
        raise SystemExit(f"{lock_file}: {len(doc['entries'])} entries; the lab hosts are one platform")
    return doc["entries"][0]


def installed_bytes(entry: dict) -> tuple[int, int]:
    """(the lock's installed sizes summed, entries without one), packages and tools, as preflight's disk gate sums."""
    sizes = [e.get("installed_size") for e in entry["packages"] + entry["tools"]]
    return sum(s or 0 for s in sizes), sum(1 for s in sizes if not isinstance(s, int))


def results_with(res, key: str) -> dict:
    """{host: the last result of any task that returned ``key``} (results nested in a loop included)."""
    out = {}
    for host, rows in res.results.items():
        for row in rows:
            found = [row.res, *((row.res or {}).get("results") or [])]
            for item in found:
                if isinstance(item, dict) and key in item:
                    out[host] = item
    return out


def plan_step(inventory: str, base: dict, env: dict, controller: Path, lock_file: Path) -> dict:
    res, wall = timed_playbook("playbooks/plan.yml", inventory, base, env)
    out: dict = {"rc": res.rc, "wall_s": wall, "lock_file": str(lock_file)}
    if res.rc != 0:
        out["failed"] = sorted({f"{r.task}: {r.msg}" for rs in res.results.values() for r in rs if r.failed})[-3:]
        return out
    entry = lock_entry(lock_file)
    installed, missing = installed_bytes(entry)
    shown = [r.res.get("msg") for rs in res.results.values() for r in rs if "Show what the lock file" in r.task]
    out.update(
        packages=len(entry["packages"]),
        tools=len(entry["tools"]),
        venv_name=entry["venv_name"],
        platform=entry["platform"],
        python=entry["python"],
        lock_wheel_bytes=sum(e.get("size") or 0 for e in entry["packages"] + entry["tools"]),
        lock_installed_bytes=installed,
        lock_entries_without_installed_size=missing,
        # What the default index sent for the wheels: the fresh controller's wheelhouse, filled once by the plan.
        wheelhouse_bytes=tree_bytes(controller / "wheelhouse"),
        wheelhouse_files=len(list((controller / "wheelhouse").glob("*.whl"))),
        plan_lines=(shown[0] if shown and isinstance(shown[0], list) else shown)[:12],
        lock_rules=entry.get("lock_rules"),
    )
    return out


def fit_hosts(hosts: list[str], entry: dict, work: Path) -> tuple[list[str], str]:
    """The hosts the disk allows: each takes its venv (the lock's installed sizes) and its wheelhouse copy; the site
    cache one more copy of the wheels. Fewer hosts (down to 1) when FREE_FLOOR would not stay free."""
    wheels = sum(e.get("size") or 0 for e in entry["packages"] + entry["tools"])
    per_host = installed_bytes(entry)[0] + wheels
    free = shutil.disk_usage(work).free
    count = len(hosts)
    while count > 1 and free - wheels - count * per_host < FREE_FLOOR:
        count -= 1
    why = (
        f"{free / GB:.1f} GB free; each host needs {per_host / GB:.1f} GB (venv + its wheelhouse), the site cache"
        f" {wheels / GB:.1f} GB: {count} host(s) keep {(free - wheels - count * per_host) / GB:.1f} GB free"
    )
    return hosts[:count], why


def upgrade_step(inventory: str, upvars: dict, env: dict, hosts: list[str], controller: Path) -> dict:
    load_before = os.getloadavg()[1]
    res, wall = timed_playbook("playbooks/upgrade.yml", inventory, upvars, env, limit=",".join(hosts))
    builds = {h: r for h, r in results_with(res, "not_judged").items()}
    out: dict = {
        "rc": res.rc,
        "wall_s": wall,
        "load_avg_5m": [round(load_before, 1), round(os.getloadavg()[1], 1)],
        "build_steps_s": {h: b.get("seconds") for h, b in builds.items()},
        "not_judged": {h: b.get("not_judged") for h, b in builds.items()},
        "build_task_s": {h: host_task_s(res, BUILD_TASK, h) for h in hosts},
        "top_tasks_s": dict(sorted(task_durations(res).items(), key=lambda kv: -kv[1])[:8]),
    }
    if res.rc != 0:
        out["failed"] = [f"{r.host}: {r.task}: {r.msg}" for rs in res.results.values() for r in rs if r.failed][-4:]
        out["tail"] = res.stdout[-3000:]
    out["outcomes"] = {}
    for host in hosts:
        reports = sorted((controller / "runs").glob(f"*/{host}.json"), key=lambda p: p.stat().st_mtime)
        out["outcomes"][host] = json.loads(reports[-1].read_text()).get("outcome") if reports else None
    return out


def host_bytes(host: str, paths: list[str]) -> dict:
    got = sh(host, f"du -sb {' '.join(paths)} 2>/dev/null; find {paths[0]} -type f | wc -l").stdout.split()
    sizes = {path: int(size) for size, path in zip(got[0:-1:2], got[1:-1:2], strict=True)}
    return {"bytes": sizes, "venv_files": int(got[-1])}


def find_stub(wheelhouse: Path) -> tuple[Path | None, str]:
    """NVIDIA's stub libcuda.so from the first wheel of ``wheelhouse`` that carries one (…/lib/stubs/libcuda.so)."""
    import zipfile

    for wheel in sorted(wheelhouse.glob("*.whl")):
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.endswith("stubs/libcuda.so"):
                    dest = wheelhouse.parent / "libcuda-stub" / "libcuda.so"
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(zf.read(name))
                    return dest, f"{wheel.name}: {name}"
    return None, f"no wheel of {wheelhouse} carries stubs/libcuda.so"


STUB_PROBE = (
    "import ctypes,sys; lib=ctypes.CDLL(sys.argv[1]); rc=lib.cuInit(0); n=ctypes.c_int(-1);"
    " rc2=lib.cuDeviceGetCount(ctypes.byref(n)); print(rc, rc2, n.value)"
)


def give_stub(host: str, stub: Path, python: str) -> dict:
    """The stub as libcuda.so.1 in a folder of its own on the host, and what it answers (CUDA_ERROR_STUB_LIBRARY is
    34: the stub resolves every driver symbol and fails every call)."""
    sh(host, f"mkdir -p {STUB_DIR}")
    podman("cp", str(stub), f"{host}:{STUB_DIR}/libcuda.so")
    sh(host, f"ln -sf libcuda.so {STUB_DIR}/libcuda.so.1")
    probe = sh(host, f"{python} -c {shlex.quote(STUB_PROBE)} {STUB_DIR}/libcuda.so.1").stdout.split()
    return {"cuInit": probe[0] if probe else None, "cuDeviceGetCount": probe[1:] if probe else None}


def verify_with_stub(host: str, venv: str, entry: dict, profile: dict) -> dict:
    """The venv check (verify_venv.py, as the build runs it) again with the stub on LD_LIBRARY_PATH and a GPU
    required: what the driver-less host listed as not judged is then imported with every driver symbol resolved."""
    pkgs = profile["wheels"]["packages"]
    spec = {
        "packages": {p["name"]: p["version"] for p in entry["packages"]},
        "imports": [p["name"] for p in pkgs],
        "torch_like": [p["name"] for p in pkgs if p["name"] == "torch" or p["name"].endswith(("-torch", "_torch"))],
        "cuda_version": profile["cuda"]["version"],
        "local_tags": {p["name"]: p["local_tag"] for p in pkgs if p.get("local_tag")},
        "same_version": (profile["wheels"].get("rules") or {}).get("same_version") or [],
        "gpu_required": True,
    }
    podman("cp", str(VERIFIER), f"{host}:/tmp/verify_venv.py")
    cmd = f"LD_LIBRARY_PATH={STUB_DIR} {venv}/bin/python /tmp/verify_venv.py {shlex.quote(json.dumps(spec))}"
    t0 = time.monotonic()
    got = sh(host, cmd, timeout=1800)
    try:
        answer = json.loads(got.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = {"raw": (got.stdout + got.stderr)[-2000:]}
    return {"rc": got.returncode, "s": round(time.monotonic() - t0, 1), "answer": answer}


def timed_imports(host: str, venv: str, modules: list[str], env: str = "") -> dict:
    """Each import in its own process, twice (the second reads the bytecode the first may have written)."""
    out = {}
    for module in modules:
        probe = (
            f"for i in 1 2; do s=$(date +%s.%N); {env} {venv}/bin/python -c {shlex.quote('import ' + module)}"
            ' >/tmp/imp.out 2>&1; rc=$?; e=$(date +%s.%N); python3 -c "print($e - $s, $rc)"; done;'
            ' grep -E "Error|error" /tmp/imp.out | tail -n 2'
        )
        lines = sh(host, probe, timeout=900).stdout.splitlines()
        (first, rc), (second, _rc) = lines[0].split(), lines[1].split()
        row = {"ok": rc == "0", "s": [round(float(first), 2), round(float(second), 2)]}
        out[module] = {**row, **({"error": lines[2:]} if rc != "0" else {})}
    return out


def audit_step(inventory: str, base: dict, env: dict, hosts: list[str]) -> dict:
    res, wall = timed_playbook("playbooks/audit.yml", inventory, base, env, check=True, limit=",".join(hosts))
    verdicts = res.audit_reports() if res.rc == 0 else {}
    summary = [line for line in res.stdout.splitlines() if "audited," in line]
    return {
        "rc": res.rc,
        "wall_s": wall,
        "in_sync": {h: r.get("in_sync") for h, r in verdicts.items()},
        "drift": {h: r.get("drift", [])[:4] for h, r in verdicts.items() if r.get("drift")},
        "summary": summary[-1:] if summary else [],
    }


def compare_builds(host: str, inventory: str, base: dict, env: dict, venv: str, lock_txt: str, python: str) -> dict:
    """The role's build against ansible.builtin.pip on ``host``: each from the host's wheelhouse (warm, as the
    upgrade left it), with no venv of the lock and empty tool caches, the file system synced first."""
    rows = {}

    def fresh() -> None:
        sh(host, f"rm -rf {venv} {SERVING}/bench-pip /root/.cache/uv /root/.cache/pip && sync")

    fresh()
    res, wall = timed_playbook(ROLE_BUILD_PLAYBOOK, inventory, base, env, limit=host)
    builds = results_with(res, "not_judged")
    rows["role"] = {
        "rc": res.rc,
        "wall_s": wall,
        "build_task_s": host_task_s(res, BUILD_TASK, host),
        "steps_s": (builds.get(host) or {}).get("seconds"),
        "venv": host_bytes(host, [venv]) if res.rc == 0 else None,
    }
    if res.rc != 0:
        rows["role"]["failed"] = [f"{r.task}: {r.msg}" for r in res.results.get(host, []) if r.failed][-2:]
    print(json.dumps({"role_build": rows["role"]}, indent=1, default=str), flush=True)
    fresh()
    # ansible.builtin.pip imports packaging on the host: a venv of the host's Python with the controller's copy.
    sh(host, f"{python} -m venv {PIP_MODULE_PY}")
    site = sh(host, f"echo {PIP_MODULE_PY}/lib/python3.*/site-packages").stdout.strip()
    podman("cp", packaging_path(), f"{host}:{site}/")
    pip_vars = {
        "bench_lock_file": lock_txt,
        "bench_venv": f"{SERVING}/bench-pip",
        "bench_python": python,
        "ansible_python_interpreter": f"{PIP_MODULE_PY}/bin/python",
    }
    res, wall = timed_playbook(PIP_PLAYBOOK, inventory, pip_vars, env, limit=host)
    rows["pip"] = {
        "rc": res.rc,
        "wall_s": wall,
        "task_s": host_task_s(res, PIP_TASK, host),
        "venv": host_bytes(host, [f"{SERVING}/bench-pip"]) if res.rc == 0 else None,
    }
    if res.rc != 0:
        rows["pip"]["failed"] = [f"{r.task}: {(r.msg or '')[-600:]}" for r in res.results.get(host, []) if r.failed]
    sh(host, f"rm -rf {SERVING}/bench-pip {PIP_MODULE_PY} /root/.cache/pip")
    if rows["role"]["rc"] == 0 and rows["pip"]["rc"] == 0:
        rows["pip_over_role"] = round(rows["pip"]["task_s"] / max(rows["role"]["build_task_s"], 0.1), 2)
    return rows


def packaging_path() -> str:
    import packaging

    return packaging.__path__[0]


def fleet(args, real: Path, work: Path, env: dict) -> int:
    """The lock-file flow over ``args.hosts`` lab hosts (see the module's docstring); one JSON document at the end,
    each step's figures printed as it ends and kept in <work>/real_stack-fleet.json."""
    controller = work / "controller"
    shutil.rmtree(controller, ignore_errors=True)
    controller.mkdir(parents=True)
    out: dict = {"profile": str(real.relative_to(REPO)), "command": " ".join(["bench/real_stack.py", *sys.argv[1:]])}
    out_file = work / "real_stack-fleet.json"

    def show(key: str, value) -> None:
        out[key] = value
        print(json.dumps({key: value}, indent=1, default=str), flush=True)
        out_file.write_text(json.dumps(out, indent=1, default=str) + "\n")

    profile_path = lab_profile(real, work / "profiles")
    profile = yaml.safe_load(profile_path.read_text())
    version = profile["python"]["version"]
    python = f"/usr/bin/python{version}"
    lock_file = work / f"{real.stem}.lock.yml"
    lock_file.unlink(missing_ok=True)
    cache = None
    try:
        ports = mirror_ports()
        mirrors.build()
        mirrors.start(ports)
        nodes.down(LAB_NAME)
        t0 = time.monotonic()
        lab = nodes.up(args.hosts, LAB_NAME, ports)
        hosts, inventory = lab["nodes"], lab["inventory"]
        for host in hosts:  # the node image's own Python stays where it has the profile's version (the lab profiles)
            if sh(host, f"test -x {python}").returncode != 0:
                give_python(host, version, python_prefix(version, args.python_prefix))
        show("lab", {"hosts": hosts, "up_s": round(time.monotonic() - t0, 1), "reniced": len(renice(hosts))})
        cache = sc.start(LAB_NAME, controller_dir=controller, clear=True)
        base = {
            "gpufleet_stack_profile": str(profile_path),
            "gpufleet_index_urls": {},
            "gpufleet_controller_dir": str(controller),
            "gpufleet_lock_file": str(lock_file),
        }
        since = time.time()
        show("plan", plan_step(inventory, base, env, controller, lock_file))
        if out["plan"]["rc"] != 0:
            return 1
        show("plan_site_cache", sc.read_counts(LAB_NAME, since=since))
        entry = lock_entry(lock_file)
        used, why = fit_hosts(hosts, entry, work)
        show("hosts_used", {"hosts": used, "why": why})
        renice(used)
        upvars = {
            **base,
            "gpufleet_fleet_cache_url": cache["url"],
            "gpufleet_distribution": "pull",
            "gpufleet_batch_size": len(used),
        }
        since = time.time()
        show("upgrade", upgrade_step(inventory, upvars, env, used, controller))
        counts = sc.read_counts(LAB_NAME, since=since)
        counts["served_bytes_per_host"] = round(counts["served_bytes"] / len(used))
        show("site_cache", counts)
        venv = f"{SERVING}/venvs/{entry['venv_name']}"
        installed, _missing = installed_bytes(entry)
        show(
            "venvs",
            {
                "lock_installed_bytes": installed,
                # preflight's disk gate (filter disk_gate): the lock's installed sizes times preflight_space_factor
                "disk_gate_estimate_bytes": int(installed * SPACE_FACTOR),
                **{h: host_bytes(h, [venv, "/opt/gpufleet/wheelhouse"]) for h in used},
            },
        )
        first = used[0]
        if not args.no_bytecode:
            show("bytecode", venv_figures(first, venv, bytecode=True))
        show("imports_without_driver", timed_imports(first, venv, IMPORTS))
        stub, where = (Path(args.stub), "given by --stub") if args.stub else find_stub(controller / "wheelhouse")
        if stub:
            stubbed = {"from": where, "answers": give_stub(first, stub, python)}
            stubbed["verify_venv_gpu_required"] = verify_with_stub(first, venv, entry, profile)
            stubbed["imports"] = timed_imports(first, venv, IMPORTS, env=f"LD_LIBRARY_PATH={STUB_DIR}")
            show("stub_libcuda", stubbed)
        else:
            show("stub_libcuda", {"from": where})
        show("audit", audit_step(inventory, base, env, used))
        last = used[-1]
        res, wall = timed_playbook("playbooks/rollback.yml", inventory, base, env, limit=last)
        current = sh(last, f"readlink {SERVING}/current").stdout.strip()
        show("rollback", {"host": last, "rc": res.rc, "wall_s": wall, "current": current})
        show("audit_after_rollback", audit_step(inventory, base, env, used))
        if not args.no_compare:
            lock_txt = f"{SERVING}/locks/{entry['venv_name']}.txt"
            show("install_compare", compare_builds(last, inventory, base, env, venv, lock_txt, python))
        print(json.dumps(out, indent=1, default=str))
        ok = out["upgrade"]["rc"] == 0 and out["audit"]["rc"] == 0
        return 0 if ok else 1
    finally:
        if cache:
            sc.stop(LAB_NAME)
        if not args.keep:
            nodes.down(LAB_NAME)
            shutil.rmtree(sc.site_cache_dir(LAB_NAME), ignore_errors=True)
        if not args.keep_wheels:
            shutil.rmtree(controller / "wheelhouse", ignore_errors=True)
            shutil.rmtree(work / "uv-cache", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
