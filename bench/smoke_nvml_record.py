# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Record every NVML call that nvml_info's collector makes on this machine, with its real answer.

    python bench/smoke_nvml_record.py OUT.json

The recording (call, arguments, result or NVML error code) is replayed by tests/data/device/nvml_fake.py, so the
unit tests judge the answers of a real GPU and can turn any single call into NotSupported.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _nvml


def jsonable(value):
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, ctypes.Structure):
        return {name: jsonable(getattr(value, name)) for name, *_ in value._fields_}
    if hasattr(value, "__dict__"):
        return {k: jsonable(v) for k, v in vars(value).items() if not k.startswith("_")}
    return repr(value)


class Recorder:
    """Stands in for pynvml: forwards each nvml* call and keeps what it answered."""

    def __init__(self, nvml):
        self._nvml = nvml
        self._handles = {}
        self._keep = []  # handles stay alive so their id() is not reused
        self.calls = []

    def __getattr__(self, name):
        attr = getattr(self._nvml, name)
        if not (callable(attr) and name.startswith("nvml")):
            return attr

        def call(*args):
            shown = [self._handles.get(id(a), a) if not isinstance(a, (int, str, bytes)) else a for a in args]
            entry = {"fn": name, "args": jsonable(shown)}
            try:
                result = attr(*args)
            except self._nvml.NVMLError as exc:
                entry.update(error=getattr(exc, "value", None), message=str(exc))
                self.calls.append(entry)
                raise
            if name == "nvmlDeviceGetHandleByIndex":
                self._handles[id(result)] = f"handle{args[0]}"
                self._keep.append(result)
                entry["result"] = f"handle{args[0]}"
            else:
                entry["result"] = jsonable(result)
            self.calls.append(entry)
            return result

        return call


def main(path):
    nvml = _nvml.load_pynvml()
    recorder = Recorder(nvml)
    _nvml.init(recorder)
    began = time.perf_counter()
    facts = _nvml.collect(recorder)
    seconds = time.perf_counter() - began
    recorder.nvmlShutdown()
    out = {
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "pynvml": getattr(nvml, "__version__", None),
        "collect_seconds": round(seconds, 4),
        "calls": recorder.calls,
        "facts": facts,
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(out, handle, indent=1)
    print(f"{len(recorder.calls)} NVML calls in {seconds:.3f} s -> {path}")


if __name__ == "__main__":
    main(sys.argv[1])
