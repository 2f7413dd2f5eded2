# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where a package may come from, with real HTTP servers on loopback: a site mirror answering 403 for every path, an
index that does not answer at all (a closed port) and a default index (lab.serve's pypi server, its requests logged).

A package comes only from an index the profile names for it. An index that refuses it while a later one serves it
is said on the console (the action's warnings), first in the plan's diff and in the report; a package whose every
named index refuses fails the plan naming the index, the package and the fix, and the lock file is not written."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_wheel_plan import make_action

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from lab.common import free_port  # noqa: E402
from lab.mirrors import PrivateServer  # noqa: E402
from lab.tiny_wheel import tiny_wheel  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("uv", path=str(Path(sys.executable).parent)) is None, reason="needs uv beside the tests' Python"
)
HOST = {"inventory_hostname": "ctl"}


class Forbidding:
    """A site mirror whose access is broken: 403 for every path, every method; requests logged."""

    def __init__(self):
        self.log = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.log.append((self.command, self.path))
                self.send_response(403)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_HEAD = do_GET

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/simple"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/simple"  # nothing listens there


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    base = tmp_path_factory.mktemp("refusals")
    root = base / "default"
    root.mkdir()
    tiny_wheel(root, "serve-app", "1.0", ["app-dep>=1"])
    tiny_wheel(root, "app-dep", "1.0")
    site = Forbidding()
    default = PrivateServer("refusals-default", ["--kind", "pypi", "--root", str(root)], "/simple", base / "d.jsonl")
    try:
        yield {"site": site, "default": default, "log": base / "d.jsonl", "down": closed_port_url()}
    finally:
        site.close()
        default.stop()


def profile(servers, indexes, **wheels_extra):
    urls = {"site": servers["site"].url, "down": servers["down"], "default": servers["default"].url}
    named = set(indexes) | set((wheels_extra.get("dependency_indexes") or {}).values()) | {"default"}
    urls = {n: u for n, u in urls.items() if n in named}
    return {
        "name": "refusals",
        "python": {"version": "3.11"},
        "cuda": {"version": "13.0"},
        "wheels": {
            "indexes": [{"name": n, "url": u} for n, u in urls.items()],
            "packages": [{"name": "serve-app", "spec": "==1.0", "indexes": indexes}],
            "rules": {},
            **wheels_extra,
        },
    }


def plan(servers, tmp_path, prof, check_mode=False):
    args = {
        "profile": prof,
        "controller_dir": str(tmp_path / "ctl"),
        "tools": [],
        "lock_file": str(tmp_path / "fleet.lock.yml"),
        "timeout": 10,
    }
    return make_action(args, check_mode=check_mode, diff=True).run(task_vars=HOST)


def default_asked(servers, project):
    lines = [json.loads(line) for line in servers["log"].read_text().splitlines()]
    return [r for r in lines if r["path"].rstrip("/").endswith(f"/simple/{project}")]


@pytest.mark.parametrize("check_mode", [True, False], ids=["check", "apply"])
def test_a_site_mirror_refusing_is_said_on_the_console_and_first_in_the_diff(servers, tmp_path, check_mode):
    result = plan(servers, tmp_path, profile(servers, ["site", "default"]), check_mode=check_mode)
    assert not result.get("failed"), result.get("msg")
    line = (
        f"index refused: index 'site' ({servers['site'].url}) answered HTTP 403 for the project page of"
        " serve-app; planned from index 'default', another index the profile names for it. Fix: if 'site' should"
        " serve serve-app, check its URL and access (gpufleet_index_urls); if it does not carry serve-app, remove it"
        " from the package's indexes in the profile"
    )
    assert result["warnings"] == [line]  # the console: Ansible prints each as [WARNING]
    assert result["diff_lines"][0] == line  # playbooks/plan.yml prints these under the lock file's line
    assert result["diff"][1] == {"prepared": line}  # --diff
    assert result["index_refusals"] == [
        {
            "package": "serve-app",
            "index": "site",
            "url": servers["site"].url,
            "status": "HTTP 403",
            "planned_from": "default",
        }
    ]
    entry = result["entries"][0]
    assert {p["name"]: p["index"] for p in entry["packages"]}["serve-app"] == "default"
    if not check_mode:
        report = Path(result["report_path"]).read_text().splitlines()
        assert report[:2] == ["plan diff against the previous lock file:", line]


def test_a_package_whose_only_index_refuses_fails_and_is_never_taken_from_another(servers, tmp_path):
    before = len(default_asked(servers, "serve-app"))
    result = plan(servers, tmp_path, profile(servers, ["site"]))
    assert result["failed"]
    assert result["msg"] == (
        "ctl: wheel plan for profile 'refusals', x86_64-manylinux_2_28 Python 3.11, failed: package serve-app: every"
        f" index the profile names for it refused it: index 'site' ({servers['site'].url}) answered HTTP 403 for the"
        " project page of serve-app. A package is taken only from the indexes the profile names for it (wheels.packages"
        " serve-app: site), never from another one. Fix: if 'site' should serve serve-app (a site mirror answering"
        " 403 refuses every package), check its URL and access, or map it to a mirror that serves it with"
        " gpufleet_index_urls; else name an index that carries serve-app for it in the profile. The lock file"
        f" {tmp_path / 'fleet.lock.yml'} was not changed"
    )
    assert ("GET", "/simple/serve-app/") in servers["site"].log
    # The default index, which carries serve-app, was never asked for it.
    assert len(default_asked(servers, "serve-app")) == before
    assert not (tmp_path / "fleet.lock.yml").exists()


def test_a_dependency_named_for_one_refusing_index_fails_instead_of_coming_from_another(servers, tmp_path):
    prof = profile(servers, ["default"], dependency_indexes={"app-dep": "site"})
    result = plan(servers, tmp_path, prof)
    assert result["failed"]
    assert (
        f"package app-dep: every index the profile names for it refused it: index 'site' ({servers['site'].url})"
        " answered HTTP 403 for the project page of app-dep. A package is taken only from the indexes the profile names"
        " for it"
        " (wheels.dependency_indexes app-dep: site), never from another one."
    ) in result["msg"]
    assert not (tmp_path / "fleet.lock.yml").exists()


def test_an_index_that_does_not_answer_is_a_refusal_and_the_next_one_serves(servers, tmp_path):
    result = plan(servers, tmp_path, profile(servers, ["down", "default"]))
    assert not result.get("failed"), result.get("msg")
    (refusal,) = result["index_refusals"]
    assert refusal["index"] == "down" and refusal["status"].startswith("unreachable: ")
    assert result["warnings"][0].startswith(
        f"index refused: index 'down' ({servers['down']}) could not be reached for serve-app ("
    )
    # The dependency resolution (uv) left the unreachable index out instead of failing on it.
    assert {p["name"] for p in result["entries"][0]["packages"]} == {"serve-app", "app-dep"}


def test_a_package_whose_only_index_does_not_answer_fails_naming_it(servers, tmp_path):
    result = plan(servers, tmp_path, profile(servers, ["down"]))
    assert result["failed"]
    assert (
        f"package serve-app: every index the profile names for it refused it: index 'down' ({servers['down']})"
        in (result["msg"])
    )
    assert "could not be reached for serve-app (" in result["msg"]
    assert "Fix: if 'down' should serve serve-app" in result["msg"]
