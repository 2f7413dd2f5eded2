# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's lock file: stable bytes, the diff a review reads, the profile's hash, each host's entry."""

from __future__ import annotations

import copy
import http.server
import re
import threading

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file as lf

PROFILE = {
    "name": "lab",
    "source": {"path": "/x/stacks/lab.yml", "sha256": "f" * 64},
    "python": {"version": "3.11"},
    "cuda": {"version": "13.0", "sources": {"redist": {"url": "http://127.0.0.1:38102/redist"}}},
    "wheels": {
        "indexes": [{"name": "lab-main", "url": "http://127.0.0.1:38100/simple"}],
        "packages": [{"name": "lab-sgl-kernel", "spec": ">=0.3.21", "local_tag": "cu130", "indexes": ["lab-main"]}],
    },
}


def pkg(name, version, sha, role="profile"):
    filename = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    return {
        "name": name,
        "version": version,
        "filename": filename,
        "url": f"http://127.0.0.1:38100/packages/{filename}",
        "sha256": sha * 64,
        "index": "lab-main" if role == "profile" else None,
        "size": 1000,
        "role": role,
    }


def lock(platform="x86_64-manylinux_2_36", python="3.11", kernel="0.3.21+cu130", kernel_sha="a", extra=()):
    packages = [pkg("six", "1.17.0", "b", "dependency"), pkg("lab-sgl-kernel", kernel, kernel_sha), *extra]
    digest = (kernel_sha + platform + python).encode().hex()[:64].ljust(64, "0")
    return {
        "schema": 1,
        "profile": "lab",
        "python": python,
        "platform": platform,
        "hash": digest,
        "hash12": digest[:12],
        "venv_name": f"lab-{digest[:12]}",
        "generated_at": "2026-12-06T00:00:00+00:00",
        "packages": packages,
        "tools": [pkg("uv", "0.13.8", "c", "tool")],
        "overrides": [],
        "report": {"lab-sgl-kernel": {"why": "newest"}},
        "lock_rules": {"cuda": {}},
    }


def test_the_same_plan_gives_the_same_bytes_whatever_the_order_of_targets_and_packages():
    a, b = lock(), lock("aarch64-manylinux_2_39")
    shuffled = copy.deepcopy(a)
    shuffled["packages"].reverse()
    one = lf.dumps(lf.make_document(PROFILE, [a, b], "2026-12-06T00:00:00+00:00"))
    two = lf.dumps(lf.make_document(PROFILE, [b, shuffled], "2026-12-06T00:00:00+00:00"))
    assert one == two
    doc = lf.loads(one)
    assert [e["platform"] for e in doc["entries"]] == ["aarch64-manylinux_2_39", "x86_64-manylinux_2_36"]
    assert [p["name"] for p in doc["entries"][1]["packages"]] == ["lab-sgl-kernel", "six"]
    # The planner's candidate report goes beside the file, not into it; the profile's name and hash are inside.
    assert "report" not in doc["entries"][0]
    assert doc["profile"] == {"name": "lab", "hash": lf.profile_hash(PROFILE)}
    assert one.startswith("# gpufleet lock file")


def test_the_profile_hash_ignores_urls_and_where_the_file_was_read_but_not_a_value():
    mirrored = copy.deepcopy(PROFILE)
    mirrored["wheels"]["indexes"][0]["url"] = "http://mirror.site.example/simple"
    mirrored["source"] = {"path": "/elsewhere/lab.yml", "sha256": "0" * 64}
    assert lf.profile_hash(mirrored) == lf.profile_hash(PROFILE)
    changed = copy.deepcopy(PROFILE)
    changed["wheels"]["packages"][0]["spec"] = ">=0.3.22"
    assert lf.profile_hash(changed) != lf.profile_hash(PROFILE)


def test_a_lock_file_of_another_profile_or_of_a_changed_profile_is_refused_with_the_fix():
    doc = lf.make_document(PROFILE, [lock()], "t")
    lf.check_profile(doc, PROFILE, "fleet.lock.yml")
    changed = copy.deepcopy(PROFILE)
    changed["python"]["version"] = "3.12"
    with pytest.raises(
        lf.LockFileError, match=r"planned for profile lab .*the profile changed since the plan.*plan.yml"
    ):
        lf.check_profile(doc, changed, "fleet.lock.yml")
    other = dict(PROFILE, name="cu130")
    with pytest.raises(lf.LockFileError, match=r"not for profile cu130.*No host was changed"):
        lf.check_profile(doc, other, "fleet.lock.yml")


def test_a_file_that_is_not_a_lock_file_is_refused_naming_what_it_lacks():
    with pytest.raises(lf.LockFileError, match="not a gpufleet lock file"):
        lf.loads("packages: []\n", "x.yml")
    doc = lf.make_document(PROFILE, [lock()], "t")
    del doc["entries"][0]["packages"][0]["sha256"]
    with pytest.raises(lf.LockFileError, match=r"entry 1 \(packages\[0\]\.sha256\)"):
        lf.loads(lf.dumps(doc), "x.yml")


def test_plan_targets_group_hosts_by_architecture_and_python_at_the_lowest_glibc():
    hosts = {
        "a1": "x86_64-manylinux_2_39",
        "a2": "x86_64-manylinux_2_35",
        "g1": "aarch64-manylinux_2_39",
        "a3": "x86_64-manylinux_2_36",
    }
    assert lf.plan_targets(hosts, "3.12") == [
        {"platform": "aarch64-manylinux_2_39", "python": "3.12", "hosts": ["g1"]},
        {"platform": "x86_64-manylinux_2_35", "python": "3.12", "hosts": ["a1", "a2", "a3"]},
    ]
    per_host = lf.plan_targets(hosts, {"a1": "3.12", "a2": "3.11", "a3": "3.12", "g1": "3.12"})
    assert [(t["platform"], t["python"]) for t in per_host] == [
        ("aarch64-manylinux_2_39", "3.12"),
        ("x86_64-manylinux_2_35", "3.11"),
        ("x86_64-manylinux_2_36", "3.12"),
    ]


def test_each_host_takes_the_entry_of_its_group_and_a_host_without_one_is_refused():
    doc = lf.make_document(
        PROFILE,
        [lock("x86_64-manylinux_2_28"), lock("x86_64-manylinux_2_36", kernel_sha="d"), lock("aarch64-manylinux_2_39")],
        "t",
    )
    assert lf.select_entry(doc, "x86_64-manylinux_2_39", "3.11")["platform"] == "x86_64-manylinux_2_36"
    assert lf.select_entry(doc, "x86_64-manylinux_2_31", "3.11")["platform"] == "x86_64-manylinux_2_28"
    assert lf.select_entry(doc, "aarch64-manylinux_2_40", "3.11")["platform"] == "aarch64-manylinux_2_39"
    with pytest.raises(
        lf.LockFileError, match=r"node3: the lock file has no entry for its platform x86_64-manylinux_2_17"
    ):
        lf.select_entry(doc, "x86_64-manylinux_2_17", "3.11", "node3")
    with pytest.raises(lf.LockFileError, match=r"Python 3.12 \(entries: aarch64"):
        lf.select_entry(doc, "x86_64-manylinux_2_36", "3.12", "node4")


def test_the_diff_names_exactly_the_new_build_with_old_and_new_versions_and_hashes():
    old = lf.make_document(PROFILE, [lock()], "t1")
    new = lf.make_document(PROFILE, [lock(kernel="0.3.22+cu130", kernel_sha="e")], "t2")
    change = lf.diff(old, new)
    assert change["changed"]
    (entry,) = change["entries"]
    assert entry["added"] == [] and entry["removed"] == []
    assert [c["name"] for c in entry["changed"]] == ["lab-sgl-kernel"]
    assert entry["changed"][0]["old"]["version"] == "0.3.21+cu130"
    assert entry["changed"][0]["new"]["sha256"] == "e" * 64
    lines = lf.diff_lines(change)
    assert lines[1] == "  ~ lab-sgl-kernel 0.3.21+cu130 (sha256 aaaaaaaaaaaa) -> 0.3.22+cu130 (sha256 eeeeeeeeeeee)"
    assert lines[0].startswith("x86_64-manylinux_2_36 Python 3.11: lab-")
    # Same wheels, another date: no change.
    again = lf.make_document(PROFILE, [lock()], "t3")
    assert lf.diff(old, again)["changed"] is False
    assert lf.diff_lines(lf.diff(old, again)) == ["no change against the previous lock file"]


def test_the_diff_lists_added_and_removed_packages_and_entries_and_a_first_plan():
    old = lf.make_document(PROFILE, [lock(extra=[pkg("idna", "3.7", "1", "dependency")])], "t1")
    new = lf.make_document(PROFILE, [lock(extra=[pkg("certifi", "1", "2", "dependency")]), lock("aarch64-linux")], "t2")
    lines = lf.diff_lines(lf.diff(old, new))
    assert "  + certifi 1 (sha256 222222222222)" in lines
    assert "  - idna 3.7 (sha256 111111111111)" in lines
    assert any(line.startswith("aarch64-linux Python 3.11: (none) -> lab-") for line in lines)
    first = lf.diff_lines(lf.diff(None, new))
    assert first[0] == "no previous lock file: every package below is new"
    assert "  + lab-sgl-kernel 0.3.21+cu130 (sha256 aaaaaaaaaaaa)" in first


def test_write_then_read_round_trips_and_the_report_goes_beside_it(tmp_path):
    path = tmp_path / "fleet.lock.yml"
    doc = lf.make_document(PROFILE, [lock()], "t")
    lf.write(str(path), lf.dumps(doc))
    assert lf.read(str(path)) == doc
    assert lf.report_path(str(path)) == str(tmp_path / "fleet.lock.report.txt")
    with pytest.raises(lf.LockFileError, match="cannot be read"):
        lf.read(str(tmp_path / "absent.yml"))


def test_entry_lock_is_what_the_roles_take():
    doc = lf.make_document(PROFILE, [lock()], "t")
    taken = lf.entry_lock(doc, doc["entries"][0], "/r/fleet.lock.yml", "/c/wheelhouse")
    assert taken["venv_name"] == lock()["venv_name"]
    assert taken["profile"] == "lab" and taken["path"] == "/r/fleet.lock.yml"
    assert taken["wheelhouse"] == "/c/wheelhouse" and taken["tools"][0]["name"] == "uv"


def test_missing_wheels_are_named_in_one_refusal():
    lf.refuse_missing({"lab-a": []}, "the wheelhouse", "f.yml")
    with pytest.raises(lf.LockFileError, match=r"the wheelhouse no longer holds .*lab-a: x.whl, y.whl.*No host was"):
        lf.refuse_missing({"lab-a": ["x.whl", "y.whl"], "lab-b": []}, "the wheelhouse", "f.yml")


class _Cache(http.server.BaseHTTPRequestHandler):
    served = {"/wheels/six-1.17.0-py3-none-any.whl": 1000, "/wheels/uv-0.13.8-py3-none-any.whl": 999}

    def do_HEAD(self):
        size = self.served.get(self.path)
        self.send_response(200 if size is not None else 404)
        self.send_header("Content-Length", str(size or 0))
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_site_cache_missing_a_wheel_or_serving_another_size_is_named():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Cache)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        wheels = [pkg("six", "1.17.0", "b"), pkg("uv", "0.13.8", "c"), pkg("lab-sgl-kernel", "0.3.21+cu130", "a")]
        missing = lf.missing_from_site_cache(wheels, url, timeout=5)
    finally:
        server.shutdown()
    assert len(missing) == 2
    assert missing[0].startswith("uv-0.13.8-py3-none-any.whl (site cache serves 999 bytes, the lock has 1000)")
    assert missing[1].startswith("lab_sgl_kernel-0.3.21+cu130-py3-none-any.whl (site cache") and "404" in missing[1]


LOCK_TEXT = """# lab-aaaaaaaaaaaa: lock {h}
lab-sgl-kernel==0.3.21+cu130 --hash=sha256:{a}
six==1.17.0 --hash=sha256:{b}
# tool: uv==0.13.8 --hash=sha256:{c}
""".format(h="a" * 64, a="a" * 64, b="b" * 64, c="c" * 64)
RECORD = {
    "state_path": "/var/lib/gpufleet/state.json",
    "lock": {"venv_name": "lab-aaaaaaaaaaaa", "hash": "a" * 64, "profile": "lab", "file": "/c/x.lock.yml"},
    "lock_text": LOCK_TEXT,
    "lock_text_path": "/opt/gpufleet/serving/locks/lab-aaaaaaaaaaaa.txt",
}


def test_the_host_recorded_lock_is_read_from_the_state_record_and_the_lock_text():
    taken = lf.recorded_lock(RECORD, "lab")
    assert taken["venv_name"] == "lab-aaaaaaaaaaaa" and taken["source"] == "host"
    assert taken["packages"] == [
        {"name": "lab-sgl-kernel", "version": "0.3.21+cu130"},
        {"name": "six", "version": "1.17.0"},
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lock": None}, r"^the host records no lock of its last upgrade .*-e gpufleet_lock_file"),
        (
            {"lock": dict(RECORD["lock"], profile="cu128")},
            r"of profile cu128, not of lab; fix: .*gpufleet_stack_profile=cu128",
        ),
        ({"lock_text": None}, r"the host's copy of it, /opt/gpufleet/serving/locks/lab-aaaaaaaaaaaa.txt, is missing"),
        ({"lock_text": LOCK_TEXT.replace("a" * 64, "d" * 64, 1)}, r"is not the lock a{64} the state file records"),
    ],
)
def test_a_host_without_a_usable_record_has_no_lock_and_says_why(change, message):
    taken = lf.recorded_lock(dict(RECORD, **change), "lab")
    assert taken["packages"] == [] and taken["venv_name"] == ""
    assert re.search(message, taken["no_lock"]), taken["no_lock"]


def test_dumps_takes_values_ansible_templated():
    """A platform read from host facts is a tagged str (data tagging): the lock file is still written."""
    from ansible._internal._datatag._tags import Origin
    from ansible.module_utils._internal._datatag import AnsibleTagHelper

    tagged = AnsibleTagHelper.tag("x86_64-manylinux_2_36", [Origin(path="/inventory")])
    assert isinstance(tagged, str) and tagged.__class__ is not str  # a subclass of str, as data tagging makes it
    assert "platform: x86_64-manylinux_2_36\n" in lf.dumps({"platform": tagged})


def test_the_prepare_note_says_where_the_lock_came_from():
    from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _outcome

    doc = lf.make_document(PROFILE, [lock()], "t")
    taken = lf.entry_lock(doc, doc["entries"][0], "/r/fleet.lock.yml", "/c/wheelhouse")
    facts = {"venv_rebuild_path": "/opt/v", "lock_origin": taken["origin"]}
    assert _outcome.phase_note("prepare", facts) == {
        "prepare": "ok: /opt/v built and verified (lock from lock file /r/fleet.lock.yml), the host still serving"
    }
    assert _outcome.phase_note("prepare", {"venv_rebuild_path": "/opt/v"}) == {
        "prepare": "ok: /opt/v built and verified, the host still serving"
    }


def test_the_file_keeps_who_computed_a_hash_and_the_installed_size_but_not_the_planner_s_graph(tmp_path):
    planned = lock()
    planned["packages"][0].update(sha256_source="controller", installed_size=52_000)
    planned["lock_rules"]["required_by"] = {"six": ["lab-sgl-kernel"]}
    path = tmp_path / "fleet.lock.yml"
    lf.write(str(path), lf.dumps(lf.make_document(PROFILE, [planned], "t")))
    packages = {p["name"]: p for p in lf.read(str(path))["entries"][0]["packages"]}
    assert packages["six"]["sha256_source"] == "controller" and packages["six"]["installed_size"] == 52_000
    # A package the planner said nothing of carries neither key (as in lock files written before them).
    assert "sha256_source" not in packages["lab-sgl-kernel"] and "installed_size" not in packages["lab-sgl-kernel"]
    assert "required_by" not in lf.read(str(path))["entries"][0]["lock_rules"]
