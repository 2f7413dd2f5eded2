#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: jit_cache
short_description: Build a serving stack's FlashInfer JIT kernels into the cache its server will use, before the drain
version_added: 0.1.0
description:
  - "Runs the builder C(plugins/module_utils/_jit_build.py) with the new venv's python (O(python)), the new toolkit
    (O(cuda_home)) and the host's SMs (O(archs), else every GPU's compute capability from C(nvidia-smi)), so the
    kernels land in C(<workspace_base>/.cache/flashinfer/<version>/<archs>/cached_ops), where the new server's
    FlashInfer looks first. Needs nvcc, no GPU: the old server keeps serving on the GPUs meanwhile."
  - "Builds only what the cache lacks; C(changed) when it built something. Kernels already there, an old stack's cache
    (another version folder) and anything else in the folder are left alone: a rollback finds the old cache as it was."
  - In check mode builds nothing and reports the kernels missing (C(missing)), which the caller can call drift.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode: {support: full, details: builds nothing; the builder only looks which kernels are present.}
  diff_mode: {support: none}
  platform: {platforms: posix}
options:
  python: {description: The new venv's interpreter., type: path, required: true}
  workspace_base:
    description: The server's FLASHINFER_WORKSPACE_BASE (its user's home without one).
    type: path
    required: true
  cuda_home: {description: The toolkit whose nvcc builds (the new stack's)., type: path, required: true}
  archs:
    description: SMs to build for, as FlashInfer spells them (C(9.0a), C(12.0a)); empty = every GPU's, from nvidia-smi.
    type: list
    elements: str
    default: []
  kernels:
    description: Kernels the server needs (kind single_decode, single_prefill or sampling; dtype, head_dim, backend).
    type: list
    elements: dict
    required: true
  timeout_s: {description: Seconds the build may take., type: int, default: 1800}
author: gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Build the new stack's kernels before the drain
  gpufleet.upgrade.jit_cache:
    python: /opt/gpufleet/serving/venvs/cu130-0123456789ab/bin/python
    workspace_base: /root
    cuda_home: /usr/local/cuda-13.0
    kernels:
      - {kind: single_decode, dtype: bfloat16, head_dim: 128}
      - {kind: sampling}
"""

RETURN = r"""
built: {description: Kernels built now., returned: always, type: list}
present: {description: Kernels the cache held already., returned: always, type: list}
missing: {description: Kernels the cache lacks (check mode; empty after a build)., returned: always, type: list}
jit_dir: {description: Where the kernels are., returned: when the builder ran, type: str}
archs: {description: The SMs built for., returned: always, type: list}
"""

import inspect
import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _jit_build


def flashinfer_archs(compute_caps) -> list:
    """``9.0`` -> ``9.0a`` (FlashInfer's own spelling for SM 9 and newer, the folder a server on that GPU uses)."""
    archs = []
    for cap in compute_caps:
        major, _dot, minor = str(cap).strip().partition(".")
        if major.isdigit() and minor.isdigit():
            arch = f"{major}.{minor}{'a' if int(major) >= 9 else ''}"
            if arch not in archs:
                archs.append(arch)
    return archs


def host_archs(module):
    smi = module.get_bin_path("nvidia-smi")
    if not smi:
        return []
    rc, out, _err = module.run_command([smi, "--query-gpu=compute_cap", "--format=csv,noheader"])
    return flashinfer_archs(out.split()) if rc == 0 else []


def main():
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "workspace_base": {"type": "path", "required": True},
            "cuda_home": {"type": "path", "required": True},
            "archs": {"type": "list", "elements": "str", "default": []},
            "kernels": {"type": "list", "elements": "dict", "required": True},
            "timeout_s": {"type": "int", "default": 1800},
        },
        supports_check_mode=True,
    )
    p = module.params
    archs = p["archs"] or host_archs(module)
    if not archs:
        module.exit_json(changed=False, built=[], present=[], missing=[], archs=[], skipped=True,
                         msg="skipped: no GPU seen (nvidia-smi) and no archs given")  # fmt: skip
    script = os.path.join(module.tmpdir, "gpufleet_jit_build.py")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(inspect.getsource(_jit_build))
    request = {"archs": archs, "workspace_base": p["workspace_base"], "kernels": p["kernels"],
               "check_only": module.check_mode}  # fmt: skip
    env = {"CUDA_HOME": p["cuda_home"], "PATH": f"{p['cuda_home']}/bin:{os.environ.get('PATH', '')}"}
    rc, out, err = module.run_command(
        ["timeout", str(p["timeout_s"]), p["python"], script, json.dumps(request)], environ_update=env
    )
    try:
        result = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"error": f"the builder printed no result (rc {rc}): {(err or out).strip()[-800:]}"}
    if result.get("error") or result.get("failed"):
        module.fail_json(
            msg=f"the JIT kernels of {p['python']} could not be built for {', '.join(archs)} with {p['cuda_home']}: "
            f"{result.get('error') or 'failed: ' + ', '.join(result['failed'])}; the old stack still serves and "
            "nothing else was changed. Fix the toolkit or the kernel list, then run again",
            rc=rc,
            stderr=err[-2000:],
            archs=archs,
        )
    built = result.get("built", [])
    module.exit_json(changed=bool(built), built=built, present=result.get("present", []),
                     missing=result.get("missing", []), jit_dir=result.get("jit_dir"), archs=archs,
                     seconds=result.get("seconds"))  # fmt: skip


if __name__ == "__main__":
    main()
