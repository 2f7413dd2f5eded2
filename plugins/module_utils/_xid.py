# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU errors in the kernel log: the NVIDIA driver's Xid lines (``NVRM: Xid (PCI:0000:3b:00): 79, ...``), read from
the journal's kernel messages or from dmesg, kept when logged since a time on the boot's monotonic clock (the
serving unit's start), mapped to a GPU through its PCI bus id, and judged against the Xids the profile lists
(``postcheck.xid.fail_on``). Pure functions; the reader takes the module's run_command."""

from __future__ import annotations

import json
import re

# The driver prints the PCI address without the function: "PCI:0000:3b:00" (domain:bus:device).
PCI = r"(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
XID_RE = re.compile(r"NVRM: Xid \(PCI:" + PCI + r"\): (?P<xid>\d+)(?:, ?(?P<detail>.*))?")
# Newer drivers tell a GPU that fell off the bus in three lines and no Xid; it is Xid 79 all the same.
OFF_BUS_RE = re.compile(r"NVRM: The NVIDIA GPU " + PCI + r"\s*$")
DMESG_TIME_RE = re.compile(r"^\s*\[\s*(?P<t>\d+\.\d+)\]\s?")
# "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: ..." (syslog's copy of the kernel log)
SYSLOG_PREFIX_RE = re.compile(r"^\w{3}\s+\d+\s+[\d:]+\s+\S+\s+kernel:\s?")

# What an operator does about each listed class (NVIDIA's Xid catalogue names the same actions).
FIXES = {
    79: "the GPU fell off the bus: check its seating, power and temperature, then reset it or reboot the host; take"
    " the host out of the fleet if it happens again",
    48: "an uncorrectable ECC error: read its row remaps (nvidia-smi -q -d ROW_REMAPPER) and reset the GPU to apply"
    " pending remaps; replace the GPU if remapping failed",
    63: "a row remap is pending: reset the GPU (or reboot) to apply it, then run the post-check again",
    64: "a row remap failed: the GPU's memory cannot repair itself; take the host out of the fleet and replace the GPU",
    94: "a contained ECC error: the process on that GPU was stopped; reset the GPU and run the post-check again",
    95: "an uncontained ECC error: every process on the GPU is gone; reset the GPU (or reboot) and run the post-check"
    " again",
}
GENERIC_FIX = "read NVIDIA's Xid catalogue for this Xid, reset the GPU or reboot the host, and run the post-check again"


def pci_key(address) -> tuple | None:
    """One spelling of a PCI address: NVML's '00000000:3B:00.0' and the driver's '0000:3b:00' -> (0, 0x3b, 0)."""
    if not address:
        return None
    parts = str(address).strip().lower().split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)
    except ValueError:
        return None


def _event(xid: int, pci: str, line: str, detail: str | None, monotonic_s: float | None) -> dict:
    return {"xid": xid, "pci": pci.lower(), "line": line.strip(), "detail": (detail or "").strip(), "at_s": monotonic_s}


def parse_lines(lines, times=None) -> list[dict]:
    """Xid events of kernel log lines. ``times``: each line's seconds since boot, where known (the journal's);
    otherwise a dmesg ``[ 1843.308145]`` prefix gives it."""
    events = []
    lines = list(lines)
    for i, raw in enumerate(lines):
        line = SYSLOG_PREFIX_RE.sub("", raw.rstrip("\n"))
        at = times[i] if times is not None else None
        stamp = DMESG_TIME_RE.match(line)
        if stamp:
            at = at if at is not None else float(stamp.group("t"))
        m = XID_RE.search(line)
        if m:
            events.append(_event(int(m.group("xid")), m.group("pci"), raw, m.group("detail"), at))
            continue
        m = OFF_BUS_RE.search(line)
        if m and any("fallen off the bus" in nxt for nxt in lines[i + 1 : i + 4]):
            text = " ".join(x.strip() for x in lines[i : i + 4] if "NVRM:" in x)
            events.append(_event(79, m.group("pci"), text, "GPU has fallen off the bus (no Xid line)", at))
    return events


def parse_dmesg(text: str) -> list[dict]:
    return parse_lines((text or "").splitlines())


def _message(value) -> str:
    # journalctl -o json writes a message that is not valid UTF-8 as a list of byte values
    if isinstance(value, list):
        return bytes(v for v in value if isinstance(v, int)).decode("utf-8", "replace")
    return str(value or "")


def parse_journal_json(text: str) -> list[dict]:
    """``journalctl -k -o json`` output, one object a line; the time is ``__MONOTONIC_TIMESTAMP`` (microseconds since
    boot, the clock systemd's ``ExecMainStartTimestampMonotonic`` uses)."""
    lines, times = [], []
    for row in (text or "").splitlines():
        try:
            entry = json.loads(row)
        except ValueError:
            continue
        lines.append(_message(entry.get("MESSAGE")))
        mono = entry.get("__MONOTONIC_TIMESTAMP")
        times.append(int(mono) / 1e6 if str(mono or "").isdigit() else None)
    return parse_lines(lines, times)


def since(events: list[dict], since_s: float | None) -> list[dict]:
    """The events logged at or after ``since_s`` (seconds since boot); an event without a time is kept: the gate
    would rather name an old error than miss a new one."""
    if since_s is None:
        return list(events)
    return [e for e in events if e["at_s"] is None or e["at_s"] >= since_s]


def map_gpus(events: list[dict], gpus: list[dict]) -> list[dict]:
    """Add the GPU (NVML index and UUID) each event's PCI address names, where NVML listed it."""
    by_pci = {pci_key(g.get("pci_bus_id")): g for g in gpus or [] if pci_key(g.get("pci_bus_id"))}
    out = []
    for e in events:
        gpu = by_pci.get(pci_key(e["pci"]))
        out.append(dict(e, gpu_index=gpu.get("index") if gpu else None, gpu_uuid=gpu.get("uuid") if gpu else None))
    return out


def gpu_words(event: dict) -> str:
    if event.get("gpu_index") is not None:
        return f"GPU {event['gpu_index']} ({event.get('gpu_uuid') or 'uuid unknown'}, PCI {event['pci']})"
    return f"the GPU at PCI {event['pci']} (not among NVML's GPUs)"


def judge(events: list[dict], fail_on, host: str, since_s: float | None = None) -> dict:
    """``{passed, reasons, notes, events}``: one reason per listed Xid and GPU (first line quoted, count given),
    one note per Xid logged but not listed."""
    listed = {int(x) for x in fail_on or ()}
    when = f" since the serving unit started ({since_s:.1f} s after boot)" if since_s is not None else ""
    groups: dict = {}
    for e in events:
        groups.setdefault((e["xid"], e["pci"]), []).append(e)
    reasons, notes = [], []
    for (xid, _pci), group in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        first = group[0]
        count = f" ({len(group)} times)" if len(group) > 1 else ""
        said = f"{host}: {gpu_words(first)} logged Xid {xid}{count}{when}: {first['line']!r}"
        if xid in listed:
            reasons.append(
                f"{said}; Xid {xid} is in the profile's postcheck.xid.fail_on; fix: {FIXES.get(xid, GENERIC_FIX)}"
            )
        else:
            notes.append(f"{said} (not in postcheck.xid.fail_on: reported, not failed)")
    return {"passed": not reasons, "reasons": reasons, "notes": notes, "events": events}


def read_kernel_log(run, which) -> tuple[str, list[dict], str | None]:
    """Read this boot's kernel messages: the journal's (with monotonic times), else dmesg's. Returns
    ``(source, events, error)``; ``source`` is None when neither could be read, and ``error`` says why."""
    errors = []
    journalctl = which("journalctl")
    if journalctl:
        rc, out, err = run([journalctl, "-k", "-b", "-o", "json", "--no-pager"])
        if rc == 0 and out.strip():
            return "journal", parse_journal_json(out), None
        errors.append(f"journalctl -k -b: rc {rc}, {(err or '').strip()[:200] or 'no kernel messages'}")
    dmesg = which("dmesg")
    if dmesg:
        rc, out, err = run([dmesg])
        if rc == 0:
            return "dmesg", parse_dmesg(out), None
        errors.append(f"dmesg: rc {rc}, {(err or '').strip()[:200]}")
    else:
        errors.append("dmesg is not installed")
    return None, [], "; ".join(errors)


def unit_start_s(unit: str, run, which) -> float | None:
    """The serving unit's main process start, seconds since boot (None: not known)."""
    systemctl = which("systemctl")
    if not (unit and systemctl):
        return None
    rc, out, _err = run([systemctl, "show", "-p", "ExecMainStartTimestampMonotonic", "--value", unit])
    value = (out or "").strip()
    if rc != 0 or not value.isdigit() or int(value) == 0:
        return None
    return int(value) / 1e6


def check(run, which, fail_on, gpus, host, since_s=None, unit=None) -> dict:
    """The whole gate: read the log, keep what came since the unit started, map to GPUs, judge."""
    if since_s is None:
        since_s = unit_start_s(unit, run, which)
    source, events, error = read_kernel_log(run, which)
    verdict = judge(map_gpus(since(events, since_s), gpus), fail_on, host, since_s)
    verdict.update(source=source, since_s=since_s, fail_on=sorted(int(x) for x in fail_on or ()))
    if source is None:
        verdict["notes"].insert(0, f"{host}: the kernel log could not be read, so no Xid was judged ({error})")
    elif since_s is None:
        verdict["notes"].insert(0, f"{host}: the serving unit's start is not known: every Xid of this boot counts")
    return verdict
