# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Replays an NVML recording (bench/smoke_nvml_record.py) as a stand-in for pynvml.

Constants and the NVMLError class come from the real pynvml, so an error raised here is exactly what
pynvml raises. `overrides` replace single answers: fn name -> value, Err(code), or a callable(args) -> either.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pynvml

HERE = Path(__file__).resolve().parent
H200_RECORDING = HERE / "h200-nvml-record.json"
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
UNKNOWN = pynvml.NVML_ERROR_UNKNOWN


class Err:
    def __init__(self, code):
        self.code = code


def load(path=H200_RECORDING):
    return json.loads(Path(path).read_text())


def replicate(recording, count):
    """A host of `count` GPUs, each answering as GPU 0 of the recording did (with its own UUID and bus id)."""
    out = copy.deepcopy(recording)
    gpu0 = [c for c in recording["calls"] if c["args"][:1] == ["handle0"]]
    calls = [c for c in out["calls"] if c["args"][:1] != ["handle0"] and c["fn"] != "nvmlDeviceGetHandleByIndex"]
    for call in calls:
        if call["fn"] == "nvmlDeviceGetCount":
            call["result"] = count
    for index in range(count):
        calls.append({"fn": "nvmlDeviceGetHandleByIndex", "args": [index], "result": f"handle{index}"})
        for call in gpu0:
            clone = copy.deepcopy(call)
            clone["args"][0] = f"handle{index}"
            if clone["fn"] == "nvmlDeviceGetUUID":
                clone["result"] = clone["result"][:-2] + f"{index:02d}"
            if clone["fn"] == "nvmlDeviceGetPciInfo":
                clone["result"]["busId"] = f"00000000:{index + 0x10:02x}:00.0"
            calls.append(clone)
    out["calls"] = calls
    return out


def _struct(value):
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _struct(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_struct(v) for v in value]
    return value


class FakeNVML:
    def __init__(self, recording=None, overrides=None):
        recording = recording if recording is not None else load()
        self._answers = {(c["fn"], json.dumps(c["args"])): c for c in recording["calls"]}
        self._overrides = dict(overrides or {})
        self.asked = []

    def __getattr__(self, name):
        if name.startswith("nvml"):
            return lambda *args: self._answer(name, list(args))
        return getattr(pynvml, name)

    def _answer(self, name, args):
        self.asked.append((name, args))
        if name in self._overrides:
            value = self._overrides[name]
            value = value(args) if callable(value) else value
            if value is not KEEP:
                if isinstance(value, Err):
                    raise pynvml.NVMLError(value.code)
                return _struct(copy.deepcopy(value))
        if name in ("nvmlInit", "nvmlShutdown"):
            return None
        key = (name, json.dumps(args))
        if key not in self._answers:
            # Unrecorded calls are what NVML answers for links or pages the GPU lacks
            if name == "nvmlDeviceGetNvLinkState":
                raise pynvml.NVMLError(NOT_SUPPORTED)
            raise AssertionError(f"the recording holds no answer to {name}{tuple(args)}")
        call = self._answers[key]
        if "error" in call:
            raise pynvml.NVMLError(call["error"])
        return _struct(copy.deepcopy(call["result"]))


KEEP = object()  # an override callable returns KEEP to let the recorded answer through
