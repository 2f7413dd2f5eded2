# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Record the default index's listings of the stack's packages as offline test data (run once, by hand).

    .venv/bin/python scripts/record_index_data.py [--out tests/data/index] [--metadata sglang==0.5.9 ...]

For each project: the PEP 691 JSON page the default index serves (read from this machine's pip configuration,
as the planner reads it), stripped to what the planner reads (filename, hashes, requires-python, yanked,
upload-time, size) with every file URL made relative (``../../files/<filename>``): no registry host name is
kept. For each ``--metadata`` requirement: the METADATA of that version's wheels, read by the planner's own
range reads (``_index.Fetcher.metadata``), its headers only (the description body is a README), saved as
``metadata/<filename>.metadata``. ``RECORDED.json`` says
when and how much was recorded. Test servers on loopback serve these files; nothing in the tests goes online.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / ".venv" / "collections"))

from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _index, _wheels  # noqa: E402
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._profile import default_index_url  # noqa: E402

PROJECTS = ("flashinfer-python", "flashinfer-cubin", "sgl-kernel", "sglang", "torch")
METADATA = ("sglang==0.5.9", "flashinfer-python==0.6.4", "flashinfer-python==0.6.3", "flashinfer-cubin==0.6.4")
KEEP = ("filename", "hashes", "requires-python", "yanked", "upload-time", "size")


def strip_page(doc: dict) -> dict:
    files = []
    for entry in doc.get("files", []):
        kept = {k: entry[k] for k in KEEP if k in entry}
        kept["url"] = f"../../files/{entry['filename']}"
        files.append(kept)
    return {
        "meta": {"api-version": doc.get("meta", {}).get("api-version", "1.0")},
        "name": doc["name"],
        "versions": doc.get("versions", []),
        "files": files,
    }


def headers_only(raw: bytes) -> bytes:
    """METADATA without its description body (a README, with links to registries): the planner reads headers."""
    head, _sep, _body = raw.replace(b"\r\n", b"\n").partition(b"\n\n")
    return head + b"\n"


def fetch_page(fetcher: _index.Fetcher, base: str, project: str) -> dict:
    url = f"{base.rstrip('/')}/{canonicalize_name(project)}/"
    with fetcher._open(url, {"Accept": _index.JSON_TYPE}) as resp:
        return json.loads(resp.read())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "tests" / "data" / "index"))
    parser.add_argument("--project", action="append", dest="projects", help="project to record (repeatable)")
    parser.add_argument("--metadata", action="append", help="NAME==VERSION whose wheels' METADATA to record")
    args = parser.parse_args(argv)
    out = Path(args.out)
    (out / "metadata").mkdir(parents=True, exist_ok=True)
    base = default_index_url()
    fetcher = _index.Fetcher(timeout=60)
    counts = {}
    raw_pages = {}
    for project in args.projects or PROJECTS:
        raw = fetch_page(fetcher, base, project)
        raw_pages[canonicalize_name(project)] = raw
        page = strip_page(raw)
        (out / f"{canonicalize_name(project)}.json").write_text(json.dumps(page, indent=1, sort_keys=True) + "\n")
        counts[canonicalize_name(project)] = len(page["files"])
    recorded_metadata = []
    for text in args.metadata or METADATA:
        req = Requirement(text)
        raw = raw_pages.get(canonicalize_name(req.name)) or fetch_page(fetcher, base, req.name)
        for cand in _wheels.parse_project_json(raw, f"{base.rstrip('/')}/{canonicalize_name(req.name)}/", "default"):
            if cand.version in req.specifier:
                body = headers_only(fetcher._metadata_from_wheel(cand))
                (out / "metadata" / f"{cand.filename}.metadata").write_bytes(body)
                recorded_metadata.append(cand.filename)
    summary = {
        "recorded_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "source": "the default index (this machine's pip configuration), PEP 691 JSON",
        "files_per_project": counts,
        "metadata": sorted(recorded_metadata),
        "requests": fetcher.requests,
        "bytes_in": fetcher.bytes_in,
    }
    (out / "RECORDED.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
