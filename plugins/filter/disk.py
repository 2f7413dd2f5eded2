# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter disk_gate: preflight's free space judgement (role preflight, through filter preflight_gates).

Documented in ``disk_gate.yml`` beside this file. The new venv is sized from the lock when every wheel of it has
an ``installed_size`` (the sum of its zip members' uncompressed sizes, read on the controller: action wheel_plan or
wheel_lock), else from the current venv (``du``); the new toolkit from the toolkit the CUDA link points at. Both
times the space factor, unless the operator set the bytes needed.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

# The venv's estimate is shared with module venv_build, which names it when a build runs out of space.
from ansible_collections.gpufleet.upgrade.plugins.module_utils._disk import GIB, venv_need


def parse_du(lines) -> dict:
    """``du -sb`` lines (``BYTES<TAB>PATH``) as {path: bytes}."""
    sizes = {}
    for line in lines or []:
        size, _tab, path = str(line).partition("\t")
        if path and size.strip().isdigit():
            sizes[path] = int(size)
    return sizes


def parse_df(lines, host: str) -> list:
    """``df -B1 --output=target,avail`` lines (a header, then one line per path asked) as [(mount, free bytes)]."""
    mounts = []
    for line in list(lines or [])[1:]:
        fields = str(line).split()
        if len(fields) != 2 or not fields[1].isdigit():
            raise ValueError(
                f"{host}: df printed {line!r}, not 'MOUNT FREE_BYTES'; fix: make GNU coreutils df (--output) the df"
                " on the host's PATH"
            )
        mounts.append((fields[0], int(fields[1])))
    if len(mounts) != 2:
        raise ValueError(f"{host}: df printed {len(mounts)} mount line(s) for the toolkit root and the serving root")
    return mounts


def disk_gate(
    df_lines,
    host: str,
    measured=(),
    venv_path: str = "",
    cuda_path: str = "",
    toolkit_installed: bool = False,
    lock=None,
    toolkit_free_bytes: int = 0,
    venv_free_bytes: int = 0,
    space_factor: float = 1.5,
) -> dict:
    """The free space gate: {failures, report, need_toolkit, need_venv, venv_sized}."""
    sizes = parse_du(measured)
    try:
        mounts = parse_df(df_lines, host)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    factor = float(space_factor)
    if int(toolkit_free_bytes) > 0:
        need_toolkit = int(toolkit_free_bytes)
    else:
        need_toolkit = 0 if toolkit_installed else int(sizes.get(cuda_path, 0) * factor)
    need_venv, sized = venv_need(lock, sizes.get(venv_path, 0), int(venv_free_bytes), factor)
    if mounts[0][0] == mounts[1][0]:
        checks = [(mounts[0], need_toolkit + need_venv, "the new toolkit and the new venv")]
    else:
        checks = [(mounts[0], need_toolkit, "the new toolkit"), (mounts[1], need_venv, "the new venv")]
    failures = [
        f"{host}: {free / GIB:.2f} GiB free on {mount}, {need / GIB:.2f} GiB needed for {what} (venv sized {sized});"
        f" fix: free space on {mount} (old toolkits, old venvs, caches) or set preflight_toolkit_free_bytes /"
        " preflight_venv_free_bytes"
        for (mount, free), need, what in checks
        if free < need
    ]
    report = (
        f"ok: {', '.join(f'{m} {f}' for m, f in mounts)} bytes free; needs {need_toolkit} (toolkit) + {need_venv}"
        f" (venv, sized {sized})"
        if not failures
        else "failed"
    )
    return {
        "failures": failures,
        "report": report,
        "need_toolkit": need_toolkit,
        "need_venv": need_venv,
        "venv_sized": sized,
    }


class FilterModule:
    def filters(self):
        return {"disk_gate": disk_gate}
