# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Seed a lab node with the OLD stack, the way a host was built by hand before the upgrade.

Runs INSIDE the node (python3 stdlib only), fed on stdin by ``python -m lab up``:
``podman exec -i NODE python3 - --redist-url U --index-url U --serving-port P``.
Re-running is harmless: every step checks what is there first.

- CUDA 12.8 at /usr/local/cuda-12.8 from the redist mirror (sha256 checked), version.json,
  /usr/local/cuda -> /usr/local/cuda-12.8
- serving venv /opt/gpufleet/serving/venvs/lab-cu128-seed (python3 -m venv + pip from lab-main),
  /opt/gpufleet/serving/current -> venvs/lab-cu128-seed
- /etc/gpufleet/gpufleet-serving.env and gpufleet-serving.service (enabled, started)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

CUDA_RELEASE = "12.8.1"
CUDA_ROOT = Path("/usr/local/cuda-12.8")
COMPONENTS = ["cuda_nvcc", "cuda_cudart", "cuda_cccl"]
SERVING_ROOT = Path("/opt/gpufleet/serving")
VENV_NAME = "lab-cu128-seed"
UNIT = "gpufleet-serving"
OLD_SET = [
    "lab-torch==2.9.1+cu128",
    "lab-flashinfer-python==0.2.14",
    "lab-flashinfer-cubin==0.2.14",
    "lab-flashinfer-jit-cache==0.2.14+cu128",
    "lab-sgl-kernel==0.3.16+cu128",
    "six==1.16.0",
]
SGLANG = "lab-sglang==0.5.3"
MODEL = Path("/srv/models/lab-model")
DRAFT = Path("/srv/models/lab-draft")

# Hand-built hosts serve with EAGLE-3 on the old stack too (the 54.1 tok/s net-loss case the upgrade fixes).
UNIT_TEXT = """[Unit]
Description=SGLang serving (gpufleet)
After=network-online.target

[Service]
Type=simple
EnvironmentFile=/etc/gpufleet/{unit}.env
ExecStart={root}/current/bin/python -m lab_sglang --host 127.0.0.1 --port {port} --model-path {model} \
  --speculative-algorithm EAGLE3 --speculative-draft-model-path /srv/models/lab-draft \
  --speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 16
Restart=on-failure
RestartSec=2

[Install]
WantedBy=multi-user.target
"""


def say(msg: str) -> None:
    print(f"[seed {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return resp.read()


def install_cuda(redist_url: str) -> None:
    marker = CUDA_ROOT / "version.json"
    if marker.exists():
        say(f"{CUDA_ROOT} present")
        return
    manifest = json.loads(fetch(f"{redist_url}/redistrib_{CUDA_RELEASE}.json"))
    staging = Path(tempfile.mkdtemp(prefix="cuda-12.8.", dir="/usr/local"))
    for comp in COMPONENTS:
        entry = manifest[comp]["linux-x86_64"]
        data = fetch(f"{redist_url}/{entry['relative_path']}")
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["sha256"]:
            raise SystemExit(f"{comp}: sha256 {digest} != manifest {entry['sha256']}")
        subprocess.run(["tar", "-xJ", "--strip-components=1", "-C", str(staging)], input=data, check=True)
    version = {
        "cuda": {"name": "CUDA SDK", "version": CUDA_RELEASE},
        **{c: {"name": manifest[c]["name"], "version": manifest[c]["version"]} for c in COMPONENTS},
    }
    (staging / "version.json").write_text(json.dumps(version, indent=3) + "\n")
    if not (staging / "lib64").exists():
        (staging / "lib64").symlink_to("lib")
    staging.chmod(0o755)
    staging.rename(CUDA_ROOT)
    say(f"installed CUDA {CUDA_RELEASE} at {CUDA_ROOT}")


def link(path: Path, target: str) -> None:
    if path.is_symlink() and os.readlink(path) == target:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(target)
    tmp.rename(path)


def build_venv(index_url: str) -> bool:
    venv = SERVING_ROOT / "venvs" / VENV_NAME
    py = venv / "bin" / "python"
    if not py.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    have_sglang = _on_index(index_url, "lab-sglang")
    reqs = OLD_SET + ([SGLANG] if have_sglang else [])
    subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-cache-dir",
            "--index-url",
            index_url,
            *reqs,
        ],
        check=True,
    )
    link(SERVING_ROOT / "current", f"venvs/{VENV_NAME}")
    say(f"venv {venv}: {len(reqs)} requirements installed")
    return have_sglang


def _on_index(index_url: str, project: str) -> bool:
    try:
        fetch(f"{index_url}/{project}/")
    except urllib.error.HTTPError:
        return False
    return True


def write_serving(port: int, stack: str) -> None:
    env_dir = Path("/etc/gpufleet")
    env_dir.mkdir(parents=True, exist_ok=True)
    for model in (MODEL, DRAFT):
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps({"model_type": "lab", "name": model.name}) + "\n")
    (env_dir / f"{UNIT}.env").write_text(
        "# Written by the lab seed: the hand-built old stack.\n"
        f"CUDA_HOME={CUDA_ROOT}\n"
        f"PATH={CUDA_ROOT}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        f"LAB_STACK_PROFILE={stack}\n"
        "LAB_NODE_SEED=1\n"
    )
    unit = Path(f"/etc/systemd/system/{UNIT}.service")
    unit.write_text(UNIT_TEXT.format(unit=UNIT, root=SERVING_ROOT, port=port, model=MODEL))


def start_serving(port: int, timeout: float) -> None:
    subprocess.run(["systemctl", "daemon-reload"], check=True)
    subprocess.run(["systemctl", "enable", "--now", f"{UNIT}.service"], check=True, capture_output=True)
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{port}/get_server_info"
    while True:
        try:
            info = json.loads(fetch(url))
            say(f"{UNIT} answers on {port}: prefix {info.get('gpufleet_lab', {}).get('sys_prefix')}")
            return
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise SystemExit(f"{UNIT} did not answer {url} within {timeout:.0f}s") from None
            time.sleep(0.3)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redist-url", required=True)
    ap.add_argument("--index-url", required=True)
    ap.add_argument("--serving-port", type=int, required=True)
    ap.add_argument("--stack", default="lab-cu128")
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()
    timing = {}
    t = time.monotonic()
    install_cuda(args.redist_url.rstrip("/"))
    link(Path("/usr/local/cuda"), str(CUDA_ROOT))
    timing["cuda_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    have_sglang = build_venv(args.index_url.rstrip("/"))
    timing["venv_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    write_serving(args.serving_port, args.stack)
    if have_sglang:
        start_serving(args.serving_port, args.timeout)
    else:
        subprocess.run(["systemctl", "daemon-reload"], check=True)
        subprocess.run(["systemctl", "enable", f"{UNIT}.service"], check=True, capture_output=True)
        say("lab-sglang is not on the index yet: unit written and enabled, not started")
    timing["serving_s"] = round(time.monotonic() - t, 1)
    print(json.dumps({"seeded": True, "serving_started": have_sglang, "timing": timing}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
