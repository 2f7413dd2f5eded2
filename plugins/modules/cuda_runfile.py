#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: cuda_runfile
short_description: Install a CUDA toolkit side by side with NVIDIA's runfile installer
description:
  - Verifies the runfile's sha256, runs C(sh RUNFILE --silent --toolkit --toolkitpath=STAGING) into a staging
    folder next to O(dest), checks C(version.json) and C(nvcc --version), rewrites the staging path left in
    small text files (pkg-config files, uninstaller) to O(dest), and renames the staging folder to O(dest).
  - Unchanged when O(dest) already holds O(release). A O(dest) that is not a toolkit is refused.
  - The installer may move C(/usr/local/cuda); run M(gpufleet.upgrade.cuda_link) after it.
version_added: 0.1.0
options:
  runfile:
    description: Path of the runfile on the host. Not read in check mode.
    type: path
    required: true
  sha256:
    description: Expected sha256 of the runfile.
    type: str
    required: true
  dest:
    description: Toolkit folder to create, e.g. C(/usr/local/cuda-13.0).
    type: path
    required: true
  release:
    description: CUDA release C(X.Y.Z) the installed C(version.json) must name.
    type: str
    required: true
  extra_args:
    description: More installer arguments (e.g. C(--tmpdir=/var/tmp)).
    type: list
    elements: str
    default: []
  required_bytes:
    description: Free bytes needed next to O(dest) before starting.
    type: int
    default: 0
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Install CUDA 13.0 with the runfile
  gpufleet.upgrade.cuda_runfile:
    runfile: /var/tmp/cuda_13.0.2_580.95.05_linux.run
    sha256: "{{ runfile_sha256 }}"
    dest: /usr/local/cuda-13.0
    release: 13.0.2
"""

RETURN = r"""
home:
  description: The toolkit folder.
  returned: success
  type: str
status_before:
  description: What O(dest) was before (absent, present, other_release, ...).
  returned: success
  type: str
nvcc_version:
  description: C(nvcc --version) of the new toolkit.
  returned: when installed
  type: str
"""

import datetime
import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _redist as rd
from ansible_collections.gpufleet.upgrade.plugins.module_utils import _toolkit as tk

TEXT_LIMIT = 1 << 20


def relocate(root, old, new):
    """Installers write their --toolkitpath into a few text files; point those at the final folder."""
    old_b, new_b = old.encode(), new.encode()
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or os.path.getsize(path) > TEXT_LIMIT:
                continue
            with open(path, "rb") as handle:
                data = handle.read()
            if old_b in data and not data.startswith(b"\x7fELF"):
                with open(path, "wb") as handle:
                    handle.write(data.replace(old_b, new_b))


def fail(module, msg, staging=None, **kw):
    if staging:
        shutil.rmtree(staging, ignore_errors=True)
    module.fail_json(msg=msg, **kw)


def install(module, dest, staging):
    p = module.params
    parent = os.path.dirname(dest)
    if not os.access(parent, os.W_OK | os.X_OK):
        fail(module, f"cannot write {parent} as uid {os.geteuid()}; run the role with become: true", kind="permission")
    stat = os.statvfs(parent)
    if stat.f_bavail * stat.f_frsize < p["required_bytes"]:
        fail(
            module,
            f"{parent} has {stat.f_bavail * stat.f_frsize // 2**20} MiB free, the runfile install needs about"
            f" {p['required_bytes'] // 2**20} MiB; free space there or set cuda_toolkit_root elsewhere",
            kind="disk",
        )
    try:
        rd.verify_file(p["runfile"], p["sha256"], label=p["runfile"])
    except (rd.RedistError, OSError) as exc:
        fail(
            module,
            f"{exc}; fix cuda_toolkit_runfile_sha256 or the runfile source. Nothing was installed",
            kind="sha256",
        )
    shutil.rmtree(staging, ignore_errors=True)
    cmd = ["/bin/sh", p["runfile"], "--silent", "--toolkit", f"--toolkitpath={staging}"] + p["extra_args"]
    rc, out, err = module.run_command(cmd)
    if rc != 0:
        fail(
            module,
            f"the runfile installer failed (rc={rc}); see /var/log/cuda-installer.log on the host."
            " Nothing was installed",
            staging,
            cmd=cmd,
            stdout=out,
            stderr=err,
            kind="installer",
        )
    release, dummy = tk.summarize_version_json(tk.read_version_json(staging))
    if release != p["release"]:
        fail(
            module,
            f"the runfile installed CUDA {release}, not {p['release']}; give the runfile of {p['release']}",
            staging,
            kind="version",
        )
    rc, out, err = module.run_command([os.path.join(staging, "bin", "nvcc"), "--version"])
    parsed = tk.parse_nvcc_version(out)
    if rc != 0 or not parsed or parsed["release"] != ".".join(p["release"].split(".")[:2]):
        fail(
            module,
            f"the new nvcc does not report {p['release']} (rc={rc}: {(out or err).strip()[-300:]})",
            staging,
            kind="verify",
        )
    relocate(staging, staging, dest)
    marker = {
        "method": "runfile",
        "release": p["release"],
        "runfile_sha256": p["sha256"],
        "installed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    with open(os.path.join(staging, tk.MARKER), "w", encoding="utf-8") as out_file:
        json.dump(marker, out_file, indent=2, sort_keys=True)
    if os.path.lexists(dest):
        old = f"{parent}/.{os.path.basename(dest)}.gpufleet-old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dest, old)
        os.rename(staging, dest)
        shutil.rmtree(old)
    else:
        os.rename(staging, dest)
    return parsed["version"]


def main():
    module = AnsibleModule(
        argument_spec={
            "runfile": {"type": "path", "required": True},
            "sha256": {"type": "str", "required": True},
            "dest": {"type": "path", "required": True},
            "release": {"type": "str", "required": True},
            "extra_args": {"type": "list", "elements": "str", "default": []},
            "required_bytes": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    p = module.params
    dest = p["dest"].rstrip("/")
    status = tk.target_status(dest, p["release"], [])
    result = {"changed": False, "home": dest, "status_before": status["status"]}
    if status["status"] == "present":
        module.exit_json(**result)
    if status["status"] == "not_a_toolkit":
        module.fail_json(
            msg=f"{dest} exists but is not a CUDA toolkit ({status['reason']}); move it away or set cuda_toolkit_root",
            kind="not_a_toolkit",
        )
    if status["status"] == "foreign":
        module.fail_json(
            msg=f"{dest} holds CUDA {status.get('release')} installed by other means; remove it first", kind="foreign"
        )
    result["changed"] = True
    if module._diff:
        result["diff"] = {
            "before": f"{dest}: {status['status']} {status.get('release') or ''}\n",
            "after": f"{dest}: CUDA {p['release']} (runfile --toolkit)\n",
        }
    if not module.check_mode:
        staging = f"{os.path.dirname(dest)}/.{os.path.basename(dest)}.gpufleet-staging"
        result["nvcc_version"] = install(module, dest, staging)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
