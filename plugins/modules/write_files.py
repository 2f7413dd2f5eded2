#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: write_files
short_description: Write several small text files in one call, each replaced atomically only when it differs
description:
  - Writes each file of O(files) whose content, mode, owner or group differs from what is on the host, through a
    temporary file in the same folder renamed over the old one, so a reader (systemd, a server) sees the old file or
    the new one, never half of one. Files that already match are left alone.
  - One round trip for all the files, where M(ansible.builtin.template) costs two or three per file. Role serving writes
    its unit and environment file with it while the host is out of service, from the same rendering the host model
    (M(gpufleet.upgrade.host_state)) compares against.
  - The folders must exist (a missing one fails, naming it), unless O(make_folders) is set.
version_added: 0.1.0
options:
  make_folders:
    description:
      - Create a missing folder of a file (and its parents) with mode C(0755), owned by the SSH user, before writing
        it; in check mode a missing folder is only reported. Spares a task per folder where the folder is the
        collection's own (the Prometheus textfile's).
    type: bool
    default: false
    version_added: 0.2.0
  files:
    description:
      - The files, each C({path, content}) with optional C(mode) (an octal string such as C("0640")), C(owner),
        C(group) and C(label) (the name used in messages and diff headers). Other keys are ignored, so the host model's
        list of managed files (with its C(kind)) can be passed as it is.
    type: list
    elements: dict
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: One diff per file that would change, its old and new content.
  platform:
    platforms: posix
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Write the serving unit and its environment file
  gpufleet.upgrade.write_files:
    files:
      - path: /etc/gpufleet/gpufleet-serving.env
        content: "{{ lookup('ansible.builtin.template', 'serving.env.j2') }}"
        mode: "0640"
        owner: root
        group: root
      - path: /etc/systemd/system/gpufleet-serving.service
        content: "{{ lookup('ansible.builtin.template', 'serving.service.j2') }}"
        mode: "0644"
  notify: gpufleet restart serving
"""

RETURN = r"""
written:
  description: The paths written (in check mode, that would be written).
  returned: always
  type: list
  elements: str
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes


def read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def main():
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "dict", "required": True},
            "make_folders": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    written, diffs = [], []
    for number, spec in enumerate(module.params["files"]):
        path, content = spec.get("path"), spec.get("content")
        if not path or content is None:
            module.fail_json(msg=f"write_files: files[{number}] needs path and content; it has {sorted(spec)}")
        label = spec.get("label") or path
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            if not module.params["make_folders"]:
                module.fail_json(msg=f"write_files: the folder {folder} of {label} does not exist; create it first")
            if not module.check_mode:
                try:
                    os.makedirs(folder, mode=0o755, exist_ok=True)
                except OSError as exc:
                    module.fail_json(msg=f"write_files: could not create the folder {folder} of {label}: {exc}")
        new = to_bytes(content)
        old = read(path)
        attrs = module.load_file_common_arguments(
            {"path": path, "mode": spec.get("mode"), "owner": spec.get("owner"), "group": spec.get("group")}
        )
        if old == new:
            # Same content: at most the attributes (set_fs_attributes_if_different honours check mode).
            if module.set_fs_attributes_if_different(attrs, False):
                written.append(path)
            continue
        written.append(path)
        if module._diff:
            diffs.append(
                {
                    "before_header": path,
                    "after_header": f"{path} (new)",
                    "before": (old or b"").decode("utf-8", "replace"),
                    "after": content,
                }
            )
        if module.check_mode:
            continue
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(new)
                handle.flush()
                os.fsync(handle.fileno())
            # The new file has its mode and owner before it is renamed over the old one.
            module.set_fs_attributes_if_different(dict(attrs, path=tmp), False)
            module.atomic_move(tmp, path, unsafe_writes=False, keep_dest_attrs=False)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        module.set_fs_attributes_if_different(attrs, False)
    result = {"changed": bool(written), "written": written}
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
