#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: cuda_apt
short_description: Install NVIDIA's cuda-toolkit-X-Y package at a pinned version, from one apt source
description:
  - Installs O(package) at O(version) with C(apt-get), with no recommends and no python3-apt on the host.
  - With O(repo), writes that one sources line to O(repo_file) and refreshes only that source, so the run
    reads no other repository.
  - Changed when the package is missing or at another version, or the source line differs; check mode says
    so without writing. The package's scripts may move C(/usr/local/cuda); run M(gpufleet.upgrade.cuda_link) after it.
version_added: 0.1.0
options:
  package:
    description: Package name, e.g. C(cuda-toolkit-13-0).
    type: str
    required: true
  version:
    description: Exact package version (C(13.0.2-1)); empty takes the candidate.
    type: str
    default: ""
  repo:
    description: One sources.list line (C(deb [signed-by=...] URL SUITE COMPONENT)); empty uses the host's sources.
    type: str
    default: ""
  repo_file:
    description: File the O(repo) line goes to.
    type: path
    default: /etc/apt/sources.list.d/gpufleet-cuda.list
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
- name: Install cuda-toolkit-13-0 13.0.2-1 from the site's NVIDIA mirror
  gpufleet.upgrade.cuda_apt:
    package: cuda-toolkit-13-0
    version: 13.0.2-1
    repo: deb [signed-by=/usr/share/keyrings/cuda.gpg] https://mirror.example.com/cuda/debian12/x86_64 /
"""

RETURN = r"""
version_before:
  description: Installed version before the run (null if none).
  returned: success
  type: str
version:
  description: Installed version after the run (would be, in check mode).
  returned: success
  type: str
"""


from ansible.module_utils.basic import AnsibleModule

ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}


def installed_version(module, package):
    rc, out, dummy = module.run_command(["dpkg-query", "-W", "-f=${db:Status-Abbrev}|${Version}", package])
    if rc != 0:
        return None
    status, dummy, version = out.partition("|")
    return version.strip() if status.startswith("ii") else None


def read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def apt_get(module, args, what):
    rc, out, err = module.run_command(["apt-get", *args], environ_update=ENV)
    if rc != 0:
        p = module.params
        module.fail_json(
            msg=f"apt-get {what} failed (rc={rc}): {err.strip()[-400:]}. Check that the apt source"
            f" ({p['repo'] or 'the host sources'}) carries {p['package']}"
            f"{'=' + p['version'] if p['version'] else ''} (cuda_toolkit_apt_repo / cuda_toolkit_apt_version)",
            rc=rc,
            stdout=out,
            stderr=err,
        )


def main():
    module = AnsibleModule(
        argument_spec={
            "package": {"type": "str", "required": True},
            "version": {"type": "str", "default": ""},
            "repo": {"type": "str", "default": ""},
            "repo_file": {"type": "path", "default": "/etc/apt/sources.list.d/gpufleet-cuda.list"},
        },
        supports_check_mode=True,
    )
    p = module.params
    before = installed_version(module, p["package"])
    line = f"{p['repo']}\n" if p["repo"] else ""
    repo_changed = bool(line) and read(p["repo_file"]) != line
    pkg_changed = before is None or bool(p["version"] and before != p["version"])
    result = {"changed": repo_changed or pkg_changed, "version_before": before, "version": p["version"] or before}
    if module._diff and result["changed"]:
        result["diff"] = {
            "before": f"{p['package']}={before or '(not installed)'}\n" + (read(p["repo_file"]) if line else ""),
            "after": f"{p['package']}={p['version'] or '(candidate)'}\n" + line,
        }
    if module.check_mode or not result["changed"]:
        module.exit_json(**result)
    if repo_changed:
        with open(p["repo_file"], "w", encoding="utf-8") as handle:
            handle.write(line)
    if line:
        # Refresh only our source: a fleet host's other sources may be unreachable or slow.
        only = [
            "-o",
            f"Dir::Etc::sourcelist={p['repo_file']}",
            "-o",
            "Dir::Etc::sourceparts=-",
            "-o",
            "APT::Get::List-Cleanup=0",
        ]
        apt_get(module, [*only, "update"], "update")
    else:
        apt_get(module, ["update"], "update")
    if pkg_changed:
        spec = f"{p['package']}={p['version']}" if p["version"] else p["package"]
        apt_get(module, ["install", "-y", "--no-install-recommends", "--allow-downgrades", spec], f"install {spec}")
    result["version"] = installed_version(module, p["package"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
