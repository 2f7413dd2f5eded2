# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvml_info's Xid gate (option xid) over the recorded H200 (pynvml's stand-in) and a kernel log line."""

from __future__ import annotations

import json

from test_nvml_info import DATA, run_fake


def test_xid_in_the_kernel_log_fails_the_host_naming_the_gpu(monkeypatch):
    """An Xid the profile lists, logged since the unit started, makes a healthy H200 unhealthy."""
    recorded = json.loads((DATA / "h200-postcheck-warm.json").read_text())["nvml"]["gpus"][0]
    bus = recorded["pci_bus_id"].split(":", 1)[1][:-2].lower()  # '00000000:00:05.0' -> '00:05'
    line = f"[ 2000.5] NVRM: Xid (PCI:0000:{bus}): 79, pid=1234, name=python3, GPU has fallen off the bus."

    def fake_run(self, argv, **_kw):
        return (0, line + "\n", "") if argv[0].endswith("dmesg") else (1, "", "")

    monkeypatch.setattr("ansible.module_utils.basic.AnsibleModule.run_command", fake_run)
    monkeypatch.setattr(
        "ansible.module_utils.basic.AnsibleModule.get_bin_path", lambda self, name, *a, **k: f"/bin/{name}"
    )
    result, _nvml = run_fake({"xid": {"fail_on": [79], "since_s": 1000.0, "host": "gpu-01"}})
    assert result["healthy"] is False and result["status"] == "unhealthy"
    assert result["reasons"][-1].startswith(f"gpu-01: GPU 0 ({recorded['uuid']}, PCI 0000:{bus}) logged Xid 79")
    assert result["xid"]["source"] == "dmesg"
