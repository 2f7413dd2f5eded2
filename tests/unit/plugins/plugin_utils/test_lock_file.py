# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's lock file: stable bytes, the diff a review reads, the profile's hash, each host's entry."""

from __future__ import annotations

import copy
import hashlib
import http.server
import re
import threading
import zipfile
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

from ansible_collections.gpufleet.upgrade.plugins.module_utils._hash_record import HashRecord
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _lock_file as lf
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._index import collapse_republished
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._profile import load_profile
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._wheels import parse_project_html

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


# ---------------------------------------------------------------------------------------------------- issue 42


def written(tmp_path, *locks) -> str:
    path = tmp_path / "fleet.lock.yml"
    lf.write(str(path), lf.dumps(lf.make_document(PROFILE, list(locks) or [lock()], "t")))
    return str(path)


def edit(path, old, new):
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    assert text.count(old) == 1, old
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text.replace(old, new))


def test_a_lock_file_as_plan_yml_wrote_it_carries_its_digest_and_reads_back(tmp_path):
    path = written(tmp_path)
    doc = lf.read(path)
    assert doc["schema"] == "gpufleet-lock-file/2" and len(doc["digest"]["sha256"]) == 64
    assert set(doc["digest"]["entries"]["x86_64-manylinux_2_36 Python 3.11"]["packages"]) == {"lab-sgl-kernel", "six"}
    assert lf.diff(doc, lf.make_document(PROFILE, [lock()], "t"))["changed"] is False


def test_a_version_edited_by_hand_is_refused_naming_the_entry_the_package_and_the_file(tmp_path):
    path = written(tmp_path)
    edit(path, "version: 0.3.21+cu130", "version: 0.3.21.1+cu130")
    with pytest.raises(lf.LockFileError) as refused:
        lf.read(path)
    assert (
        "entry x86_64-manylinux_2_36 Python 3.11, package lab-sgl-kernel: version 0.3.21.1+cu130, but its file"
        " lab_sgl_kernel-0.3.21+cu130-py3-none-any.whl is version 0.3.21+cu130" in str(refused.value)
    )
    assert f"plan.yml -e gpufleet_lock_file={path}" in str(refused.value) and "No host was changed" in str(
        refused.value
    )


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("sha256: " + "a" * 64, "sha256: " + "f" * 64, "package lab-sgl-kernel: sha256 " + "f" * 64),
        (
            "url: http://127.0.0.1:38100/packages/six-1.17.0",
            "url: http://127.0.0.1:38100/other/six-1.17.0",
            "package six: url http://127.0.0.1:38100/other/six-1.17.0-py3-none-any.whl",
        ),
        ("venv_name: lab-", "venv_name: lab-x", "entry x86_64-manylinux_2_36 Python 3.11: venv_name"),
        ("hash: " + lf.profile_hash(PROFILE), "hash: " + "d" * 64, "its head (schema, profile or generated_at)"),
    ],
)
def test_any_other_edit_by_hand_is_refused_naming_what_was_edited(tmp_path, old, new, named):
    path = written(tmp_path)
    edit(path, old, new)
    with pytest.raises(lf.LockFileError, match=r"was edited since plan\.yml wrote it") as refused:
        lf.read(path)
    assert named in str(refused.value), str(refused.value)


def test_a_lock_file_of_schema_1_is_refused_with_the_fix_and_plan_yml_writes_it_anew(tmp_path):
    path = written(tmp_path)
    doc = lf.read(path)
    old = {k: v for k, v in doc.items() if k != "digest"}
    old["schema"] = "gpufleet-lock-file/1"
    lf.write(path, lf.dumps(old))
    with pytest.raises(lf.LockFileError, match=r"schema 'gpufleet-lock-file/1', written before .* plan it again"):
        lf.read(path)
    # plan.yml reads it as it is, finds the same wheels, and still writes the file anew.
    change = lf.diff(lf.read(path, verify=False), lf.make_document(PROFILE, [lock()], "t2"))
    assert change["changed"] and change["rewritten"] == "it is of schema 'gpufleet-lock-file/1', without a digest"
    assert lf.diff_lines(change)[0].startswith("the previous lock file is written anew: it is of schema")


def test_plan_yml_over_a_hand_edited_file_shows_the_edit_in_its_diff(tmp_path):
    path = written(tmp_path)
    edit(path, "sha256: " + "a" * 64, "sha256: " + "f" * 64)
    change = lf.diff(lf.read(path, verify=False), lf.make_document(PROFILE, [lock()], "t2"))
    lines = lf.diff_lines(change)
    assert lines[0].startswith("the previous lock file is written anew: it was edited since plan.yml wrote it")
    assert "  ~ lab-sgl-kernel 0.3.21+cu130 (sha256 ffffffffffff) -> 0.3.21+cu130 (sha256 aaaaaaaaaaaa)" in lines


def test_a_name_that_is_not_its_wheel_s_is_refused(tmp_path):
    renamed = lock()
    renamed["packages"][0]["name"] = "requests"
    with pytest.raises(lf.LockFileError, match=r"package requests: name requests, but its file six-1.17.0-py3"):
        lf.loads(lf.dumps(lf.make_document(PROFILE, [renamed], "t")), "x.yml")


def allowed(**kw):
    return lf.allowed_urls(PROFILE, **kw)


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/shadow",
        "ftp://127.0.0.1:38100/six-1.17.0-py3-none-any.whl",
        "http://127.0.0.1:38101/six-1.17.0-py3-none-any.whl",
        "http://evil.example/six-1.17.0-py3-none-any.whl",
        "https://127.0.0.1:38100/six-1.17.0-py3-none-any.whl",
        "http://127.0.0.1:38100@evil.example/six-1.17.0-py3-none-any.whl",
        "http://user@127.0.0.1:38100/six-1.17.0-py3-none-any.whl",
        "//127.0.0.1:38100/six-1.17.0-py3-none-any.whl",
        "six-1.17.0-py3-none-any.whl",
    ],
)
def test_a_wheel_url_off_the_profile_s_indexes_is_refused_naming_the_entry_and_the_url(url):
    doc = lf.make_document(PROFILE, [lock()], "t")
    doc["entries"][0]["packages"][1]["url"] = url
    with pytest.raises(lf.LockFileError) as refused:
        lf.check_urls(doc, "fleet.lock.yml", allowed())
    assert f"entry x86_64-manylinux_2_36 Python 3.11, package six: {url}" in str(refused.value)
    assert "allowed: http(s) under http://127.0.0.1:38100/" in str(refused.value)
    assert "Nothing was fetched" in str(refused.value) and "No host was changed" in str(refused.value)


def test_allowed_urls_are_the_indexes_after_mirrors_the_fleet_cache_and_the_operator_s_prefixes():
    doc = lf.make_document(PROFILE, [lock()], "t")
    lf.check_urls(doc, "fleet.lock.yml", allowed())
    tools = doc["entries"][0]["tools"][0]
    tools["url"] = "http://cache.site.example:8080/wheels/uv-0.13.8-py3-none-any.whl"
    with pytest.raises(lf.LockFileError, match=re.escape("tool uv: http://cache.site.example:8080/wheels/uv")):
        lf.check_urls(doc, "fleet.lock.yml", allowed())
    lf.check_urls(doc, "fleet.lock.yml", allowed(fleet_cache_url="http://CACHE.site.example:8080"))
    tools["url"] = "https://releases.example/org/whl/download/v1/uv-0.13.8-py3-none-any.whl"
    lf.check_urls(doc, "f", allowed(extra=["https://releases.example/org/whl/download/"]))
    for climbing in ("https://releases.example/org/whl/download/../../evil/uv.whl", "https://releases.example/org/x"):
        tools["url"] = climbing
        with pytest.raises(lf.LockFileError, match="tool uv"):
            lf.check_urls(doc, "f", allowed(extra=["https://releases.example/org/whl/download/"]))
    mirrored = copy.deepcopy(PROFILE)
    mirrored["wheels"]["indexes"][0]["url"] = "https://mirror.site.example/simple"
    with pytest.raises(lf.LockFileError, match=re.escape("package six: http://127.0.0.1:38100/packages/six")):
        lf.check_urls(lf.make_document(PROFILE, [lock()], "t"), "f", lf.allowed_urls(mirrored))


def test_pip_s_default_index_allows_where_it_serves_its_files():
    from pip._internal.models.index import PyPI

    default = copy.deepcopy(PROFILE)
    default["wheels"]["indexes"].append({"name": "default", "url": PyPI.simple_url, "is_default": True})
    assert f"https://{PyPI.file_storage_domain}/" in lf.allowed_urls(default)
    assert lf.url_allowed(
        f"https://{PyPI.file_storage_domain}/packages/aa/bb/six-1.17.0-py3-none-any.whl", lf.allowed_urls(default)
    )
    assert not lf.url_allowed(f"https://{PyPI.file_storage_domain}/x.whl", allowed())


def wheel_file(folder, filename, name, version):
    path = folder / filename
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(
            f"{name.replace('-', '_')}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n"
        )
    return path


def test_a_wheel_held_with_its_locked_sha256_whose_metadata_says_otherwise_is_refused(tmp_path):
    entry = lf.make_document(PROFILE, [lock()], "t")["entries"][0]
    six = next(p for p in entry["packages"] if p["name"] == "six")
    kernel = next(p for p in entry["packages"] if p["name"] == "lab-sgl-kernel")
    good = wheel_file(tmp_path, six["filename"], "six", "1.17.0")
    bad = wheel_file(tmp_path, kernel["filename"], "lab-sgl-kernel", "0.3.20+cu130")
    for package, path in ((six, good), (kernel, bad)):
        package["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    record = HashRecord(str(tmp_path))
    record.sha256(six["filename"])
    assert lf.metadata_problems([entry], str(tmp_path)) == []  # the kernel is not recorded as held: not judged
    record.sha256(kernel["filename"])
    record.save()
    with pytest.raises(lf.LockFileError) as refused:
        lf.check_metadata([entry], str(tmp_path), "f.yml")
    assert (
        f"entry x86_64-manylinux_2_36 Python 3.11, package lab-sgl-kernel: {kernel['filename']} holds METADATA"
        " Version 0.3.20+cu130, not 0.3.21+cu130" in str(refused.value)
    )
    bad.write_bytes(b"not a zip")
    kernel["sha256"] = hashlib.sha256(b"not a zip").hexdigest()
    record = HashRecord(str(tmp_path))
    record.sha256(kernel["filename"])
    record.save()
    assert "is not a readable wheel" in lf.metadata_problems([entry], str(tmp_path))[0]


def test_a_wheel_refused_from_the_wheelhouse_is_named_with_the_locked_and_the_found_sha256(tmp_path):
    entry = lf.make_document(PROFILE, [lock()], "t")["entries"][0]
    (tmp_path / "six-1.17.0-py3-none-any.whl").write_bytes(b"other")
    named = lf.wheelhouse_mismatches(
        ["six-1.17.0-py3-none-any.whl", "uv-0.13.8-py3-none-any.whl"], [entry], str(tmp_path)
    )
    found = hashlib.sha256(b"other").hexdigest()
    assert named == [
        f"six-1.17.0-py3-none-any.whl (locked sha256 {'b' * 64}, the file there has {found})",
        f"uv-0.13.8-py3-none-any.whl (locked sha256 {'c' * 64}, no such file there)",
    ]


def test_a_wheel_s_metadata_is_read_once_by_its_sha256(tmp_path, monkeypatch):
    entry = lf.make_document(PROFILE, [lock()], "t")["entries"][0]
    six = next(p for p in entry["packages"] if p["name"] == "six")
    path = wheel_file(tmp_path, six["filename"], "six", "1.17.0")
    six["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    record = HashRecord(str(tmp_path))
    record.sha256(six["filename"])
    record.save()
    opened = []
    real = lf.read_metadata
    monkeypatch.setattr(lf, "read_metadata", lambda p: opened.append(p) or real(p))
    assert lf.metadata_problems([entry], str(tmp_path)) == lf.metadata_problems([entry], str(tmp_path)) == []
    assert opened == [str(path)]


# ---------------------------------------------------------------------------------------------------- real pages
# Recorded pages of real indexes (tests/data/index/pages, RECORDED.json): the sgl-kernel and flashinfer-jit-cache cu130
# pages link GitHub release assets, another host than their index's; PyTorch's links files on its index host. The
# record keeps each link's path only (scripts/record_index_data.py strip_origins): LINKED puts back the host the
# public repositories' pages name, so the planner's parser reads each page as its index serves it.
PAGES = Path(__file__).resolve().parents[3] / "data" / "index" / "pages"
RECORDED = {
    # source: (profile index, page URL, origin of its links, file chosen)
    "sgl-whl-cu130": (
        "sgl-kernel-cu130",
        "https://docs.sglang.io/whl/cu130/sgl-kernel/",
        "https://github.com",
        "sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl",
    ),
    "flashinfer-whl-cu130": (
        "flashinfer-cu130",
        "https://flashinfer.ai/whl/cu130/flashinfer-jit-cache/",
        "https://github.com",
        "flashinfer_jit_cache-0.6.4+cu130-cp39-abi3-manylinux_2_28_x86_64.whl",
    ),
    "pytorch-nightly-cu130": (
        "pytorch-nightly-cu130",
        "https://download.pytorch.org/whl/nightly/cu130/torch/",
        None,  # host-relative on the real page too
        "torch-2.11.0.dev20260113+cu130-cp312-cp312-manylinux_2_28_x86_64.whl",
    ),
}


def planned_from_page(source):
    """A lock entry of the cu130 profile whose profile package is the file a plan takes from the recorded page."""
    index, page_url, origin, filename = RECORDED[source]
    (page,) = (PAGES / source).glob("*/index.html")
    text = page.read_text()
    if origin:
        text = text.replace('href="/', f'href="{origin}/')
    cands = collapse_republished(parse_project_html(text, page_url, index))
    (cand,) = [c for c in cands if c.filename == filename]
    name, version, _build, _tags = parse_wheel_filename(cand.filename)
    planned = lock(platform="x86_64-manylinux_2_28", python="3.12")
    planned["packages"] = [
        {
            "name": str(name),
            "version": str(version),
            "filename": cand.filename,
            "url": cand.url,
            "sha256": cand.sha256 or "d" * 64,
            "index": index,
            "size": 1000,
            "role": "profile",
        }
    ]
    planned["tools"] = []
    return planned


def without_files(profile, index):
    """``profile`` with no index declaring where ``index`` links its files (FlashInfer's two indexes share theirs)."""
    bare = copy.deepcopy(profile)
    (declared,) = [i["files"] for i in bare["wheels"]["indexes"] if i["name"] == index]
    for item in bare["wheels"]["indexes"]:
        if item.get("files") == declared:
            item.pop("files")
    return bare


@pytest.mark.parametrize("source", sorted(RECORDED))
def test_a_lock_planned_from_a_real_index_page_is_written_and_audited_when_the_profile_declares_where_its_files_are(
    source,
):
    cu130 = load_profile(name="cu130")
    planned = planned_from_page(source)
    doc = lf.make_document(cu130, [planned], "t")
    lf.check_urls(doc, "fleet.lock.yml", lf.allowed_urls(cu130), cu130)
    assert lf.loads(lf.dumps(doc), "fleet.lock.yml")["entries"][0]["packages"][0]["url"].startswith("https://")


@pytest.mark.parametrize("source", ["sgl-whl-cu130", "flashinfer-whl-cu130"])
def test_a_page_linking_files_on_another_host_than_its_index_is_refused_unless_the_profile_declares_it(source):
    cu130 = load_profile(name="cu130")
    index = RECORDED[source][0]
    planned = planned_from_page(source)
    url = planned["packages"][0]["url"]
    bare = without_files(cu130, index)
    field = f"wheels.indexes[{index}].files of profile cu130 ({cu130['source']['path']})"
    # Plan time: no lock file holds a URL its audit would refuse.
    with pytest.raises(lf.LockFileError) as at_plan:
        lf.make_document(bare, [planned], "t")
    assert f"package {planned['packages'][0]['name']}: {url} (planned from index {index})" in str(at_plan.value)
    assert field in str(at_plan.value) and "No lock file was written" in str(at_plan.value)
    # Audit: the same check, on a lock file written while the profile declared the host.
    doc = lf.make_document(cu130, [planned], "t")
    with pytest.raises(lf.LockFileError) as at_audit:
        lf.check_urls(doc, "fleet.lock.yml", lf.allowed_urls(bare), bare)
    assert f"(planned from index {index})" in str(at_audit.value) and field in str(at_audit.value)
    assert f"add a prefix of {url.rsplit('/', 1)[0]}/" in str(at_audit.value)
    assert "Nothing was fetched. No host was changed" in str(at_audit.value)
    # The operator's prefix allows it too, at plan and at audit.
    extra = [url.rsplit("/", 2)[0] + "/"]
    lf.check_urls(lf.make_document(bare, [planned], "t", extra), "f", lf.allowed_urls(bare, None, extra), bare)


def test_a_site_mirror_serves_its_files_itself_unless_the_site_says_where():
    mirror = "https://mirror.site.example/sgl/cu130"
    planned = planned_from_page("sgl-whl-cu130")
    github = planned["packages"][0]["url"]
    mirrored = load_profile(name="cu130", index_urls={"sgl-kernel-cu130": mirror})
    planned["packages"][0]["url"] = f"https://mirror.site.example/sgl/files/{planned['packages'][0]['filename']}"
    doc = lf.make_document(mirrored, [planned], "t")
    lf.check_urls(doc, "f", lf.allowed_urls(mirrored), mirrored)
    # The profile's files name where the original index links them, not the mirror: off the mirror, refused.
    planned["packages"][0]["url"] = github
    with pytest.raises(lf.LockFileError, match=re.escape("gpufleet_index_urls.sgl-kernel-cu130.files")):
        lf.make_document(mirrored, [planned], "t")
    site = {"sgl-kernel-cu130": {"url": mirror, "files": ["https://assets.site.example/sgl/"]}}
    told = load_profile(name="cu130", index_urls=site)
    planned["packages"][0]["url"] = f"https://assets.site.example/sgl/{planned['packages'][0]['filename']}"
    lf.check_urls(lf.make_document(told, [planned], "t"), "f", lf.allowed_urls(told), told)
    with pytest.raises(lf.LockFileError, match="package sgl-kernel"):
        lf.check_urls(lf.make_document(told, [planned], "t"), "f", lf.allowed_urls(mirrored), mirrored)
    # Where the files are is the site's, not the profile's content: the lock's profile hash stays.
    assert lf.profile_hash(told) == lf.profile_hash(mirrored) == lf.profile_hash(load_profile(name="cu130"))


def test_an_index_on_a_local_folder_lets_no_wheel_url_through():
    local = copy.deepcopy(PROFILE)
    local["wheels"]["indexes"] = [{"name": "lab-main", "url": "file:///srv/simple"}]
    assert lf.index_files(local["wheels"]["indexes"][0]) == []
    with pytest.raises(lf.LockFileError, match=re.escape("allowed: http(s) under nothing")):
        lf.make_document(local, [lock()], "t")
