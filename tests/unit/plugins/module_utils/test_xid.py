# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Xid lines of real kernel logs (tests/data/xid, sources in SOURCES.md): parsed, kept since the unit's start, mapped
to NVML's GPUs, judged against the profile's list."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _xid

DATA = Path(__file__).resolve().parents[3] / "data" / "xid"
GPUS = [
    {"index": 0, "uuid": "GPU-aaaa", "pci_bus_id": "00000000:07:00.0"},
    {"index": 1, "uuid": "GPU-bbbb", "pci_bus_id": "00000000:B3:00.0"},
]


def read(name):
    return (DATA / name).read_text()


def test_syslog_copy_gives_xid_pci_time_and_skips_other_nvrm_lines():
    events = _xid.parse_dmesg(read("gpu-operator-1146.syslog"))
    assert [(e["xid"], e["pci"], e["at_s"]) for e in events] == [
        (48, "0000:07:00", 219.470994),
        (64, "0000:07:00", 219.47105),
    ]
    assert "uncorrectable double bit error" in events[0]["detail"]


def test_ctime_dmesg_has_no_boot_time_and_is_kept_by_the_since_filter():
    events = _xid.parse_dmesg(read("gpud-46.dmesg-ctime"))
    assert [e["xid"] for e in events] == [13, 13, 109] and all(e["at_s"] is None for e in events)
    assert len(_xid.since(events, 5000.0)) == 3


def test_three_line_fallen_off_the_bus_is_xid_79():
    (event,) = _xid.parse_dmesg(read("nvsentinel-155.dmesg"))
    assert event["xid"] == 79 and event["pci"] == "0000:b3:00" and event["at_s"] == 1843.308145
    assert "fallen off the bus" in event["line"]


def journal(messages, start_us=100_000_000, step_us=1_000_000):
    return "\n".join(
        json.dumps({"MESSAGE": m, "__MONOTONIC_TIMESTAMP": str(start_us + i * step_us)}) for i, m in enumerate(messages)
    )


def test_journal_json_times_and_byte_list_messages():
    lines = read("kmsg-messages.txt").splitlines()
    text = journal(lines) + "\n" + json.dumps({"MESSAGE": list(lines[0].encode()), "__MONOTONIC_TIMESTAMP": "1"})
    events = _xid.parse_journal_json(text)
    assert [(e["xid"], e["at_s"]) for e in events] == [(79, 100.0), (94, 101.0), (149, 102.0), (79, 1e-06)]
    assert events[2]["pci"] == "0019:01:00"


def test_since_keeps_lines_from_the_unit_start_on():
    events = _xid.parse_journal_json(journal(read("kmsg-messages.txt").splitlines()))
    assert [e["xid"] for e in _xid.since(events, 101.0)] == [94, 149]


def test_judge_names_gpu_xid_line_and_fix_and_notes_unlisted():
    events = _xid.map_gpus(_xid.parse_dmesg(read("gpu-operator-1146.syslog") + read("nvsentinel-155.dmesg")), GPUS)
    verdict = _xid.judge(events, [79, 48], "gpu-07", since_s=200.0)
    assert verdict["passed"] is False
    first, second = verdict["reasons"]
    assert first.startswith("gpu-07: GPU 0 (GPU-aaaa, PCI 0000:07:00) logged Xid 48 since the serving unit started")
    assert "NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>'" in first and "postcheck.xid.fail_on" in first
    assert "row remaps" in first
    assert second.startswith("gpu-07: GPU 1 (GPU-bbbb, PCI 0000:b3:00) logged Xid 79") and "fell off the bus" in second
    assert verdict["notes"] == [n for n in verdict["notes"] if "Xid 64" in n and "not in postcheck.xid.fail_on" in n]


def test_unknown_pci_and_repeats_are_told():
    events = _xid.map_gpus(_xid.parse_dmesg(read("gpud-46.dmesg-ctime")), GPUS)
    verdict = _xid.judge(events, [13], "h")
    assert "the GPU at PCI 0000:cb:00 (not among NVML's GPUs) logged Xid 13 (2 times)" in verdict["reasons"][0]


def test_pci_key_joins_nvml_and_driver_spellings():
    assert _xid.pci_key("00000000:3B:00.0") == _xid.pci_key("0000:3b:00") == (0, 0x3B, 0)
    assert _xid.pci_key("garbage") is None


class FakeHost:
    def __init__(self, answers, tools=("journalctl", "dmesg", "systemctl")):
        self.answers, self.tools, self.ran = answers, tools, []

    def which(self, name):
        return f"/usr/bin/{name}" if name in self.tools else None

    def run(self, argv):
        self.ran.append(argv)
        return self.answers[argv[0].rsplit("/", 1)[1]]


def test_check_reads_the_journal_since_the_unit_started():
    host = FakeHost(
        {
            "systemctl": (0, "100500000\n", ""),
            "journalctl": (0, journal(read("kmsg-messages.txt").splitlines()), ""),
        }
    )
    verdict = _xid.check(host.run, host.which, [79, 94], [], "h", unit="sglang.service")
    assert verdict["source"] == "journal" and verdict["since_s"] == 100.5
    assert [e["xid"] for e in verdict["events"]] == [94, 149] and len(verdict["reasons"]) == 1
    assert [
        "/usr/bin/systemctl",
        "show",
        "-p",
        "ExecMainStartTimestampMonotonic",
        "--value",
        "sglang.service",
    ] in host.ran


def test_check_falls_back_to_dmesg_and_says_when_nothing_could_be_read():
    host = FakeHost(
        {"journalctl": (1, "", "No journal files were found."), "dmesg": (0, read("nvsentinel-155.dmesg"), "")}
    )
    verdict = _xid.check(host.run, host.which, [79], [], "h", since_s=1000.0)
    assert verdict["source"] == "dmesg" and not verdict["passed"]
    host = FakeHost(
        {"journalctl": (1, "", "No journal files were found."), "dmesg": (1, "", "Operation not permitted")}
    )
    verdict = _xid.check(host.run, host.which, [79], [], "h", since_s=1000.0)
    assert verdict["source"] is None and verdict["passed"]
    assert "the kernel log could not be read, so no Xid was judged" in verdict["notes"][0]
    assert "Operation not permitted" in verdict["notes"][0]
