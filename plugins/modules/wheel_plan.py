#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The work happens in the action plugin of the same name (plugins/action/wheel_plan.py), on the controller:
# the plan is made once per fleet run and every wheel crosses from its index once, into the controller's wheelhouse.

from __future__ import annotations

DOCUMENTATION = r"""
module: wheel_plan
short_description: Choose the serving wheels of a stack profile and lock them (URLs + sha256)
description:
  - Probes every index the profile names for every profile package, with PEP 691 JSON and a fallback to PEP 503
    HTML; parses file names, versions, local tags and compatibility tags with C(packaging); dates builds from PEP 700
    C(upload-time), else from C(devYYYYMMDD) versions, else from the file's C(Last-Modified).
  - Picks per package the newest build that satisfies the spec, the CUDA local tag, the hosts' Python and platform.
    Records every candidate seen per index with version, date and the reason it was not chosen.
  - Flags a stale source (its newest build older than C(rules.max_age_days), more than C(rules.stale_gap_days)
    behind another source of the same package, or C(rules.stale_version_gap) or more releases behind another
    source's newest release, dated or not) and refuses to pick from it unless C(allow_stale) is set. A source none
    of whose builds can be dated and that no version gap condemns is reported C(undatable) and refused or allowed
    by C(undatable) (per package or in C(rules); unset, refused for packages with a C(local_tag)).
  - HEAD requests for C(Last-Modified) go only to the builds whose date the plan reads (those passing the spec and
    tag filters, and the newest fitting release of each source), eight at a time.
  - C(wheels.overrides) (each a requirement and its reason) replace what any package's METADATA pins on their
    package, as uv's C(--override) does (and they are passed to uv); the report and the lock list every override
    with the pins of the chosen wheels it replaced. The venv's verify step accepts C(uv pip check) conflicts on
    overridden packages only.
  - Cross-package rules come from the profile and the wheels, never from code. Members of each
    C(rules.same_version) group get the same public version (the FlashInfer trio). Pins one profile package's
    METADATA puts on another (a kernel wheel's exact torch pin) are honoured. A wheel whose METADATA version
    disagrees with its file name is rejected (METADATA read via PEP 658 when the index offers it, else by HTTP
    range reads of the wheel's zip directory).
  - Dependencies of the chosen wheels are resolved by C(uv pip compile) over the profile's own indexes, with the
    chosen files as direct references, and locked the same way. Each dependency takes its best version over all of
    those indexes (C(--index-strategy unsafe-best-match)), or comes from the one index C(wheels.dependency_indexes)
    names for it.
  - Before the lock is written it must keep two rules (refused otherwise, naming the packages, versions and fix).
    Companions (C(wheels.rules.companions), and compiled wheels whose METADATA pins torch exactly) pair with the
    locked release of what they are built against; every package built for a CUDA release (local tag C(cuNNN), a
    C(-cuNN) name, NVIDIA's CUDA libraries, C(cuda-python)/C(cuda-bindings), torch by the libraries it requires) is
    built for the profile's C(cuda.version) major unless C(wheels.rules.cuda_exceptions) allows it with a reason.
  - Writes the lock to O(controller_dir)C(/locks/<profile>-<hash12>.json) with a human report beside it, downloads
    every locked wheel once into O(controller_dir)C(/wheelhouse) (sha256 verified) and returns the lock as
    RV(lock); it sets no fact (role C(venv_rebuild) registers the result and sets C(gpufleet_wheel_lock) from it).
  - Also writes the same lock as a lock file (C(<profile>-<hash12>.lock.yml) beside it, the format of O(lock_file))
    and puts first in the report that the lock was made now and where it was written, so what a run installed can be
    reviewed and applied again as it is (C(gpufleet_lock_file), action C(gpufleet.upgrade.wheel_lock)).
  - With O(lock_file) (C(playbooks/plan.yml)) it plans every group of O(hosts) and writes them as one lock file, the
    fleet's reviewed desired state; the plan report goes beside it (C(<name>.report.txt)) and the result says what
    changed against the lock file that was there (packages added, removed, changed, with versions and sha256). A
    plan that changes nothing leaves the file as it was.
  - A package comes only from the indexes the profile names for it (C(wheels.packages[].indexes); a dependency
    from the one index C(wheels.dependency_indexes) names, else from the profile's indexes). An index that refuses a
    profile package (HTTP 403 or 404 for its project page, or not reachable) while another named index serves it is
    said as a warning, first in RV(diff_lines) and in the diff, and in the report (RV(index_refusals)); an index that
    cannot be reached is left out of uv's resolution. A package every named index refuses fails the plan, naming
    the index, the package and the fix.
  - Every refusal ends with its fix. A version the indexes do not have lists first the builds the hosts could
    install and the nearest versions that have a build for the hosts' platform, Python and CUDA tag.
  - Keeps three caches in O(controller_dir)C(/cache), check mode included (caches, not the plan's output). The
    index pages, METADATA files, METADATA read from wheels by range and HEAD answers, each with the ETag and
    Last-Modified the index served it with (C(cache/index)), asked for again with C(If-None-Match) /
    C(If-Modified-Since); a re-plan of an unchanged profile makes conditional requests only, and a 304 reuses what
    is kept (an answer without a validator is not kept). The METADATA of a wheel listed (or locked) with a sha256 is
    kept by that sha256 and not asked for again. uv's cache (C(cache/uv)), from which the wheels uv
    downloaded and unpacked are removed after each plan while its index pages and the METADATA it read stay (the
    report says how many bytes remain). The sha256 the controller computed for links their index lists without one
    (C(cache/url-sha256.json)), by URL with the size, ETag and Last-Modified the index served the file with, so a
    later plan asks for those with one HEAD request instead of downloading the file. In check mode uv reads the
    chosen wheels the wheelhouse already holds (sha256 checked) instead of downloading them.
  - Runs on the controller only; needs C(packaging) and C(uv) there.
version_added: 0.1.0
options:
  profile:
    description: The validated stack profile; defaults to the fact C(gpufleet_stack) set by role C(stack).
    type: dict
  python_version:
    description: Python version of the hosts, C(X.Y); defaults to the profile's C(python.version).
    type: str
  platform:
    description:
      - The hosts' platform as C(ARCH-manylinux_2_MINOR) (the hosts' glibc) or C(ARCH-linux).
    type: str
    default: x86_64-manylinux_2_28
  controller_dir:
    description: Controller folder for locks and the wheelhouse; defaults to C(gpufleet_controller_dir).
    type: path
  fetch:
    description: Download the locked wheels into the controller's wheelhouse.
    type: bool
    default: true
  tools:
    description: Requirements locked beside the serving set for the hosts' tools venv (uv itself).
    type: list
    elements: str
    default: [uv]
  uv_path:
    description: Path of C(uv) on the controller; defaults to the one next to the controller's Python, then C(PATH).
    type: path
  timeout:
    description: Seconds to wait for each index request.
    type: int
    default: 30
  today:
    description: Date (C(YYYY-MM-DD)) that ages are measured from; defaults to today. For tests and audits.
    type: str
  lock_file:
    description:
      - Path of the fleet's lock file to write (YAML, keys sorted, entries by architecture, Python and glibc,
        packages by name; the profile's name and hash inside). The previous content is what the result's diff is
        against. Unset, the module plans one lock for O(platform) and O(python_version) as before.
    type: path
  hosts:
    description:
      - With O(lock_file), the hosts to plan for, each host's name mapped to its platform (C(ARCH-manylinux_2_MINOR),
        as role venv_rebuild's inspection reads it). One lock file entry is planned per architecture and Python,
        for the lowest glibc among that group's hosts; the Python is O(python_version). Unset, one entry for
        O(platform).
    type: dict
attributes:
  check_mode:
    support: full
    description: Can run in check mode and report the lock it would write without writing anything.
    details: Probes and resolves as usual and returns the same lock; writes neither the lock nor the wheelhouse.
  diff_mode:
    support: full
    description: Shows the plan it writes as a diff of the lock's report.
    details: The human report of the plan; with O(lock_file), the lock file before and after.
  action:
    support: full
    description: Runs as an action plugin on the controller.
notes:
  - Use with C(run_once) in a play over the fleet; the fact reaches every host of the batch.
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Plan the serving wheels once for the whole fleet
  gpufleet.upgrade.wheel_plan:
    platform: x86_64-manylinux_2_36
  run_once: true

- name: Plan the fleet's lock file for two groups of hosts
  gpufleet.upgrade.wheel_plan:
    lock_file: /srv/gpufleet/fleet.lock.yml
    python_version: "3.12"
    hosts:
      gpu-a1: x86_64-manylinux_2_35
      gpu-a2: x86_64-manylinux_2_39
      gpu-g1: aarch64-manylinux_2_39
  run_once: true
  register: plan

- name: Plan for Python 3.12 hosts without filling the wheelhouse
  gpufleet.upgrade.wheel_plan:
    profile: "{{ gpufleet_stack }}"
    python_version: "3.12"
    controller_dir: /srv/gpufleet
    fetch: false
  run_once: true
"""

RETURN = r"""
lock:
  description: The lock; role C(venv_rebuild) sets the variable C(gpufleet_wheel_lock) from it.
  returned: success
  type: dict
  contains:
    hash:
      description: sha256 over the Python version and every locked file name and sha256.
      type: str
    venv_name:
      description: C(<profile>-<hash12>), the name of the venv built from this lock.
      type: str
    packages:
      description: One entry per wheel (name, version, filename, url, sha256, index, size, role), with
        C(sha256_source) (C(index); C(controller) when the index listed the file without a sha256 and the
        controller hashed it; C(uv) when uv did) and, once the wheelhouse holds the wheel, C(installed_size) (the
        sum of its uncompressed members, which role C(preflight) sizes the new venv from).
      type: list
      elements: dict
    tools:
      description: Wheels of the hosts' tools venv, same fields.
      type: list
      elements: dict
    overrides:
      description: The profile's overrides, each with C(requirement), C(reason) and C(replaced) (C(by) the chosen
        wheel whose METADATA declared C(pin)).
      type: list
      elements: dict
    report:
      description: Per profile package the choice, why, the sources with staleness (C(stale), C(undatable),
        C(reason), C(newest), C(newest_release)), the pins overrides replaced and every candidate seen.
      type: dict
    lock_rules:
      description: What the lock rules found, C(cuda) (per package the CUDA major it is built for and how that was
        read; C(builds) for a wheel that carries a build per CUDA major and chooses one at import),
        C(cuda_allowed) (mismatches the profile allows, with its reason), C(companions) (each pair a pin or the
        profile's table proves, C(by) which; every METADATA requirement on the package it is built against is held
        against the lock), and what could not be judged, C(cuda_not_fetched) (compiled wheels not read, not being
        on the controller, as in check mode), C(cuda_unread) (pyelftools missing) and C(unjudged) (pairs no rule
        proves); the action also returns these as warnings.
      type: dict
    wheelhouse:
      description: Controller folder holding every locked wheel.
      type: str
    uv_cache:
      description: uv's cache of the plan after it was pruned, C(path) (None when it was a temporary folder),
        C(bytes) it holds and C(pruned).
      type: dict
    index_refusals:
      description: Each index that refused a profile package another named index served, as RV(index_refusals).
      type: list
      elements: dict
    index_requests:
      description: The planner's C(requests) to the indexes for this lock, C(conditional) ones, C(not_modified)
        answers and C(metadata_by_sha256) (cumulative over the targets of one run).
      type: dict
lock_path:
  description: Path of the lock file on the controller.
  returned: success
  type: str
report:
  description: The human report, one line per item.
  returned: success
  type: list
  elements: str
fetch:
  description: What crossed from the indexes in this run (files fetched or reused, C(bytes_in)), the planner's
    C(requests), those asked with validators (C(conditional)), those answered 304 (C(not_modified)) and the METADATA
    taken by its wheel's sha256 without a request (C(metadata_by_sha256)).
  returned: success
  type: dict
index_refusals:
  description: Each index that refused a profile package another named index served (C(package), C(index), C(url),
    C(status) such as C(HTTP 403) or C(unreachable ...), C(planned_from)); also in the lock as C(index_refusals).
  returned: with O(lock_file)
  type: list
  elements: dict
lock_file:
  description: The lock file written (with O(lock_file)), or the one this run's lock was also written as.
  returned: success
  type: str
report_path:
  description: The plan report beside the lock file.
  returned: with O(lock_file)
  type: str
plan_diff:
  description:
    - What the lock file changes against the previous one, C(previous) (whether there was one), C(changed),
      C(profile) (old and new hash) and per entry C(entry), C(old_venv), C(new_venv), C(added), C(removed) (each
      C(name), C(version), C(sha256), C(filename)) and C(changed) (C(name), C(old), C(new)).
  returned: with O(lock_file)
  type: dict
diff_lines:
  description: The plan diff in words, first one line per index that refused a package (C(index refused ...)), then
    one line per package (C(~ name old (sha256 ...) -> new (sha256 ...))).
  returned: with O(lock_file)
  type: list
  elements: str
targets:
  description: The groups planned, each C(platform), C(python) and C(hosts).
  returned: with O(lock_file)
  type: list
  elements: dict
group_lines:
  description: One line per group planned, C(group <platform> Python <X.Y>) and its hosts.
  returned: with O(lock_file)
  type: list
  elements: str
entries:
  description: The lock file's entries (C(platform), C(python), C(hash), C(venv_name), C(packages), C(tools), ...).
  returned: with O(lock_file)
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = {
    "profile": {"type": "dict"},
    "python_version": {"type": "str"},
    "platform": {"type": "str", "default": "x86_64-manylinux_2_28"},
    "controller_dir": {"type": "path"},
    "fetch": {"type": "bool", "default": True},
    "tools": {"type": "list", "elements": "str", "default": ["uv"]},
    "uv_path": {"type": "path"},
    "timeout": {"type": "int", "default": 30},
    "today": {"type": "str"},
    "lock_file": {"type": "path"},
    "hosts": {"type": "dict"},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="gpufleet.upgrade.wheel_plan runs as its action plugin on the controller; call it by its FQCN")


if __name__ == "__main__":
    main()
