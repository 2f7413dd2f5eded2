# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every refusal of the planner carries a fix line. A version no index has (torch==2.99.0) is refused with the
builds that fit the hosts listed first and the nearest versions that have a build for the hosts' platform and Python,
on the default index's recorded torch listing (987 files of every platform; lab/recorded_index.py on loopback)."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _index as ix
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheel_plan as wp
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _wheels as w

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from lab.recorded_index import RecordedIndex  # noqa: E402


@pytest.fixture(scope="module")
def default_index():
    with RecordedIndex(projects=("torch",)) as idx:
        yield idx


def refusal(idx, spec, python="3.12", platform="x86_64-manylinux_2_28", **extra) -> str:
    wheels = {
        "indexes": [{"name": "default", "url": idx.url}],
        "packages": [{"name": "torch", "spec": spec, "indexes": ["default"], **extra}],
        "rules": {},
    }
    rules_by_pkg, rules = w.rules_from_profile(wheels)
    target = w.Target(python, platform)
    fetcher = ix.Fetcher()
    cands = wp.probe(fetcher, wheels, rules_by_pkg, target)
    with pytest.raises(w.PlanError) as err:
        w.resolve_plan(rules_by_pkg, cands, rules, target, wp._metadata_memo(fetcher), today=dt.date(2026, 12, 1))
    return str(err.value)


def test_a_version_that_does_not_exist_lists_the_nearest_for_the_hosts_and_the_fix(default_index):
    parts = refusal(default_index, "==2.99.0").split(" | ")
    assert parts[0] == "no build of torch satisfies spec ==2.99.0 in indexes default"
    assert parts[-1] == (
        "nearest versions with a build for Python 3.12 on x86_64-manylinux_2_28: 2.15.0, 2.14.1, 2.14.0; fix: set"
        " wheels.packages torch spec to one of them, e.g. ==2.15.0"
    )
    # The candidates shown are builds the hosts could install, not the newest Windows or macOS files.
    shown = [p for p in parts[1:] if p.startswith("default: ")]
    assert len(shown) == w.NO_BUILD_LISTED
    assert all("-cp312-cp312-manylinux_2_28_x86_64.whl" in p for p in shown), shown
    assert shown[0].startswith("default: torch-2.15.0-cp312-cp312-manylinux_2_28_x86_64.whl")


def test_a_version_between_releases_gets_those_below_and_above_it(default_index):
    fix = refusal(default_index, "==2.13.5").rsplit(" | ", maxsplit=1)[-1]
    assert fix.startswith(
        "nearest versions with a build for Python 3.12 on x86_64-manylinux_2_28:"
        " 2.13.0, 2.12.1, 2.12.0, 2.14.0, 2.14.1;"
    )


def test_the_nearest_versions_follow_the_hosts_python(default_index):
    # torch 2.15.0 has no cp310 build: hosts on Python 3.10 are offered 2.14.1 first.
    fix = refusal(default_index, "==2.99.0", python="3.10").rsplit(" | ", maxsplit=1)[-1]
    assert fix.startswith("nearest versions with a build for Python 3.10 on x86_64-manylinux_2_28: 2.14.1,")


def test_no_build_for_the_hosts_at_any_version_says_so_and_what_to_change(default_index):
    fix = refusal(default_index, "==2.99.0", local_tag="cu130").rsplit(" | ", maxsplit=1)[-1]
    assert fix == (
        "fix: no index of torch has a build for Python 3.12 on x86_64-manylinux_2_28, local tag cu130 at any version:"
        " name an index that has one, or change the profile's python.version or the package's local_tag"
    )


def test_every_no_build_refusal_ends_with_a_fix():
    c = w.make_candidate("main", "six-1.17.0-py2.py3-none-any.whl", "http://127.0.0.1/six.whl")
    rule = w.PackageRule("six", w.SpecifierSet("==1.16.0"), ["main"])
    state = w.screen(rule, [c], w.Rules(), w.Target("3.11"), w.supported_tags(w.Target("3.11")), dt.date(2026, 1, 1))
    assert (
        w.no_build_message(state, {}, {})
        .rsplit(" | ", maxsplit=1)[-1]
        .startswith("nearest versions with a build for Python")
    )
    empty = w.screen(rule, [], w.Rules(), w.Target("3.11"), w.supported_tags(w.Target("3.11")), dt.date(2026, 1, 1))
    assert w.no_build_message(empty, {}, {}).endswith(
        "fix: name an index that carries six in its indexes (wheels.packages six)"
    )
