#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: serving_warmup
short_description: Warm a restarted server up until it compiles nothing new, and time its return to service
version_added: 0.1.0
description:
  - Sends the server the request shapes it will serve (the benchmark's prompts, greedy and sampled, at each
    concurrency level) pass after pass, and reads the server's JIT cache folders between passes (FlashInfer's
    C($FLASHINFER_WORKSPACE_BASE/.cache/flashinfer), else the server user's home, read from the running server's
    environment in C(/proc)). The server is warm when one whole pass left every compiled entry as it was.
  - Gate C(warmup) fails a server that still compiled in its last pass (more than O(max_compiled_after_warmup)
    kernels), naming the kernels, or whose requests all failed.
  - "With O(serving_return) (role serving's fact C(serving_return)), completes the return to service with its last
    edge (C(warm)) and judges it, gate C(return), against the return recorded on the host before (O(record_path),
    read before this run's is written): within O(max_return_ratio) times that figure. Then records this one there."
  - Pure logic in C(plugins/module_utils/_warmup.py) and C(_return.py).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: sends no request and writes no record; returns the plan and the cache folders it would watch.
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  server_url: {description: The server's base URL., type: str, default: "http://127.0.0.1:30000"}
  server_unit: {description: The serving unit; its main process's environment names the JIT cache., type: str}
  server_main_pid: {description: The server's main pid (hosts without systemd); wins over O(server_unit)., type: int}
  cache_dirs:
    description: JIT cache folders to watch instead of those read from the server's environment.
    type: list
    elements: path
    default: []
  prompt_set: {description: The benchmark's prompt set., type: str, default: v1, choices: [v1]}
  concurrency: {description: Concurrency levels the server will serve., type: list, elements: int, default: [1]}
  max_new_tokens: {description: Tokens per warm-up request (at most the prompt's own)., type: int, default: 16}
  sampling:
    description: Sampling parameters of the sampled requests (greedy ones have temperature 0).
    type: dict
    default: {temperature: 0.7, top_p: 0.9, top_k: 20}
  passes: {description: Most passes before the gate judges., type: int, default: 3}
  request_timeout: {description: Seconds one request may take (a first compile included)., type: float, default: 900}
  max_compiled_after_warmup: {description: Kernels the last pass may still build., type: int, default: 0}
  serving_return: {description: Role serving's fact serving_return (stop/process up/health times)., type: dict}
  max_return_ratio:
    description: Back to service within this many times the host's figure from before; unset = not judged.
    type: float
  record_path: {description: "Where the host's last return is kept (read first, then rewritten).", type: path}
  venv: {description: The venv the server runs (kept in the record)., type: str, default: ""}
author: gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Warm the server up and judge its return to service
  gpufleet.upgrade.serving_warmup:
    server_url: http://127.0.0.1:30000
    server_unit: sglang
    concurrency: [1, 4]
    serving_return: "{{ serving_return }}"
    max_return_ratio: 1.1
    record_path: /var/lib/gpufleet/serving-return.json
"""

RETURN = r"""
warmup:
  description: Passes (kernels compiled, requests, failures, seconds), warm, kernels, compiled_after_warmup, wall_s.
  returned: always
  type: dict
cache_dirs: {description: The JIT cache folders watched., returned: always, type: list}
return:
  description: This run's return (times, edges with total_s) and the figure from before (before), or null.
  returned: always
  type: dict
gates:
  description: Post-check gates C(warmup) and C(return) (status, reasons, notes, skipped_reason).
  returned: always
  type: dict
"""

import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _bench, _return, _server, _warmup
from ansible_collections.gpufleet.upgrade.plugins.module_utils._prompts_v1 import PROMPT_SET as PROMPTS_V1
from ansible_collections.gpufleet.upgrade.plugins.module_utils._sglang_client import Client

PROMPT_SETS = {"v1": PROMPTS_V1}
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def argument_spec():
    return {
        "server_url": {"type": "str", "default": "http://127.0.0.1:30000"},
        "server_unit": {"type": "str"},
        "server_main_pid": {"type": "int"},
        "cache_dirs": {"type": "list", "elements": "path", "default": []},
        "prompt_set": {"type": "str", "choices": sorted(PROMPT_SETS), "default": "v1"},
        "concurrency": {"type": "list", "elements": "int", "default": [1]},
        "max_new_tokens": {"type": "int", "default": 16, "no_log": False},
        "sampling": {"type": "dict", "default": {"temperature": 0.7, "top_p": 0.9, "top_k": 20}},
        "passes": {"type": "int", "default": 3, "no_log": False},
        "request_timeout": {"type": "float", "default": 900},
        "max_compiled_after_warmup": {"type": "int", "default": 0},
        "serving_return": {"type": "dict"},
        "max_return_ratio": {"type": "float"},
        "record_path": {"type": "path"},
        "venv": {"type": "str", "default": ""},
    }


def shapes(params):
    """One pass: per concurrency level, the prompt set greedy, then sampled, each level's streams all busy."""
    prompts = [
        {"text": p["text"], "max_new_tokens": min(p["max_new_tokens"], params["max_new_tokens"])}
        for p in PROMPT_SETS[params["prompt_set"]]["prompts"]
    ]
    return [
        (level, sampling, _bench.run_requests(prompts, level))
        for level in params["concurrency"]
        for sampling in (None, dict(params["sampling"]))
    ]


def make_pass(client, params):
    def send(prompt, sampling):
        return client.generate(prompt["text"], prompt["max_new_tokens"], sampling)

    def run_pass():
        sent = failed = 0
        errors = []
        for level, sampling, requests in shapes(params):
            with ThreadPoolExecutor(max_workers=level) as pool:
                records = list(pool.map(send, requests, [sampling] * len(requests)))
            sent += len(records)
            for rec in records:
                if not rec["ok"]:
                    failed += 1
                    errors.append(rec["error"])
        return {"requests": sent, "failed": failed, "errors": errors}

    return run_pass


def cache_dirs(params, module):
    """The folders to watch: given, or read from the running server's environment (its user's home otherwise)."""
    if params["cache_dirs"]:
        return list(params["cache_dirs"]), "given"
    server = _server.resolve(params, module.get_bin_path, module.run_command)
    env, source = _server.serving_environment(server.get("main_pid"), None, base_env={})
    # The server user's home, else this module's user's (no server process to read).
    home = _warmup.user_home(server.get("main_pid") or os.getpid())
    return _warmup.jit_cache_dirs(env, home), f"the server's environment ({source['kind']})"


def read_before(path, venv):
    """The return recorded on the host before this run, when it is another venv's (the stack before the upgrade)."""
    if not path or not os.path.exists(path):
        return None, f"no return recorded at {path}" if path else "no record_path given"
    try:
        with open(path, encoding="utf-8") as handle:
            doc = _return.check_record(json.load(handle), path)
    except (OSError, ValueError) as exc:
        return None, f"the record {path} is unusable ({exc})"
    if venv and doc.get("venv") == venv:
        return None, f"the return recorded at {path} is this venv's own ({venv}), not the stack's before"
    return doc, ""


def boot_id():
    try:
        with open(BOOT_ID, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def write_record(path, doc):
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    staging = os.path.join(folder, f".{os.path.basename(path)}.tmp")
    with open(staging, "w", encoding="utf-8") as handle:
        json.dump(doc, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(staging, path)


def run(module, params, clock=time.monotonic):
    host = socket.gethostname()
    # The venv a link such as current points at now: the record says which stack returned.
    params = dict(params, venv=os.path.realpath(params["venv"]) if params["venv"] else "")
    dirs, dirs_from = cache_dirs(params, module)
    client = Client(params["server_url"], timeout=params["request_timeout"])
    result = _warmup.warm_up(
        make_pass(client, params), lambda: _warmup.snapshot(dirs), params["passes"], clock, dirs=dirs
    )
    gates = {"warmup": _warmup.judge(host, result, dirs, params["max_compiled_after_warmup"])}
    ret = _return.with_warm(params["serving_return"], result["ended"], boot_id())
    before, why = read_before(params["record_path"], params["venv"])
    gates["return"] = _return.judge(host, ret, before, params["max_return_ratio"], why)
    changed = False
    if ret is not None and params["record_path"] and gates["warmup"]["status"] == "passed":
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        write_record(params["record_path"], _return.record(ret, host, params["venv"], stamp, len(result["kernels"])))
        changed = True
    if ret is not None:
        ret["before"] = before
    return {"changed": changed, "warmup": result, "cache_dirs": dirs, "cache_dirs_from": dirs_from,
            "return": ret, "gates": gates}  # fmt: skip


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    params = module.params
    if params["passes"] < 1 or not params["concurrency"] or min(params["concurrency"]) < 1:
        module.fail_json(msg=f"passes must be 1 or more and concurrency levels 1 or more, got {params['passes']}, "
                             f"{params['concurrency']}; nothing was sent")  # fmt: skip
    if module.check_mode:
        dirs, dirs_from = cache_dirs(params, module)
        module.exit_json(changed=False, cache_dirs=dirs, cache_dirs_from=dirs_from, msg="check mode: no request sent",
                         plan=[{"concurrency": c, "sampled": s is not None, "requests": len(r)}
                               for c, s, r in shapes(params)])  # fmt: skip
    module.exit_json(**run(module, params))


if __name__ == "__main__":
    main()
