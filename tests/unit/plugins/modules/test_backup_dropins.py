# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving unit's drop-ins are matched by backup_manifest itself (file_globs): a host without a drop-in folder
adds nothing and warns nothing (ansible.builtin.find warned "is not a directory" on every such host)."""

from __future__ import annotations

import json

# host is a fixture: pytest finds it by the test's argument name, imported here.
from test_safety_modules import backup_args, call, host  # noqa: F401  # pylint: disable=unused-import

from ansible_collections.gpufleet.upgrade.plugins.modules import backup_manifest


def snapshot_files(root, res):
    manifest = root / "state" / "backups" / res["backup_id"] / "manifest.json"
    return [(f["path"], f["state"]) for f in json.loads(manifest.read_text())["snapshot"]["files"]]


def test_drop_ins_are_matched_in_name_order_and_a_missing_folder_adds_nothing(host):  # noqa: F811
    unit, env = str(host / "etc" / "gpufleet-serving.service"), str(host / "etc" / "gpufleet-serving.env")
    pattern = str(host / "etc" / "gpufleet-serving.service.d" / "*.conf")
    ok, res = call(backup_manifest, backup_args(host, files=[unit, env], file_globs=[pattern]))
    assert ok and not res.get("warnings"), res
    assert snapshot_files(host, res) == [(unit, "file"), (env, "file")]
    dropins = host / "etc" / "gpufleet-serving.service.d"
    dropins.mkdir()
    (dropins / "z-limits.conf").write_text("[Service]\nLimitNOFILE=65536\n")
    (dropins / "a-env.conf").write_text("[Service]\nEnvironmentFile=/etc/old.env\n")
    (dropins / "notes.txt").write_text("not a drop-in")
    ok, res = call(backup_manifest, backup_args(host, run_id="r2", files=[unit, env], file_globs=[pattern]))
    assert ok, res
    assert snapshot_files(host, res)[2:] == [
        (str(dropins / "a-env.conf"), "file"),
        (str(dropins / "z-limits.conf"), "file"),
    ]
