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

``--shapes`` records instead the shapes of the real set's big wheels (``lab.wheel_shapes.shape_of``: file counts and
bytes by extension, from each wheel's central directory read with range requests) to ``lab/wheels/shapes.json``,
which the lab's sized wheels copy.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import urllib.parse
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / ".venv" / "collections"))
sys.path.insert(0, str(REPO))

from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

from ansible_collections.gpufleet.upgrade.plugins.plugin_utils import _index, _wheels  # noqa: E402
from ansible_collections.gpufleet.upgrade.plugins.plugin_utils._profile import default_index_url  # noqa: E402
from lab import wheel_shapes  # noqa: E402

PROJECTS = ("flashinfer-python", "flashinfer-cubin", "sgl-kernel", "sglang", "torch")
METADATA = ("sglang==0.5.9", "flashinfer-python==0.6.4", "flashinfer-python==0.6.3", "flashinfer-cubin==0.6.4")
# The real wheels the lab's sized stand-ins copy (lab.wheel_shapes.STAND_INS), by project.
SHAPES = {
    "torch": "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl",
    "sgl-kernel": "sgl_kernel-0.3.21-cp310-abi3-manylinux2014_x86_64.whl",
    "flashinfer-cubin": "flashinfer_cubin-0.6.4-py3-none-any.whl",
}
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


def record_shapes(fetcher: _index.Fetcher, base: str, out: Path) -> dict:
    """Each SHAPES wheel's shape, from its central directory (HTTP range requests), written to ``out``."""
    wheels = {}
    for project, filename in SHAPES.items():
        page = fetch_page(fetcher, base, project)
        entry = next((f for f in page.get("files", []) if f["filename"] == filename), None)
        if entry is None:
            raise SystemExit(f"{filename} is not listed by the default index's page of {project}")
        url = urllib.parse.urljoin(f"{base.rstrip('/')}/{project}/", entry["url"])
        with zipfile.ZipFile(_index._RangeFile(fetcher, url)) as zf:
            wheels[project] = wheel_shapes.shape_of(zf.infolist(), filename, int(entry["size"]))
    doc = {
        "recorded_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "source": "central directories of the default index's wheels, read with HTTP range requests"
        " (scripts/record_index_data.py --shapes)",
        "requests": fetcher.requests,
        "bytes_in": fetcher.bytes_in,
        "wheels": wheels,
    }
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "tests" / "data" / "index"))
    parser.add_argument("--project", action="append", dest="projects", help="project to record (repeatable)")
    parser.add_argument("--metadata", action="append", help="NAME==VERSION whose wheels' METADATA to record")
    parser.add_argument("--shapes", action="store_true", help=f"record the big wheels' shapes to {wheel_shapes.SHAPES}")
    args = parser.parse_args(argv)
    if args.shapes:
        doc = record_shapes(_index.Fetcher(timeout=60), default_index_url(), wheel_shapes.SHAPES)
        print(json.dumps({k: doc[k] for k in ("recorded_at", "requests", "bytes_in")}, indent=1))
        return 0
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
