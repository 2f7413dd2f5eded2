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

``--page`` records a static PEP 503 page kept in a public git repository (a CUDA index such as the sgl-kernel or
flashinfer cu130 ones) from a git mirror of that repository (``git show COMMIT:PATH``) or from a file, as it is
there but for the host of its links (made host-relative: recorded data keeps no host, as the default index's
pages keep only ``../../files/``), optionally trimmed to some versions, to ``pages/<source>/<project>/index.html``,
and describes it in ``RECORDED.json`` under ``pages``: repository, path, commit and its date, what was trimmed, for
every file name listed more than once its hashes in page order, and from a git mirror the commit and date that
first listed each hash. ``--pytorch-page`` writes a page of PyTorch's index format, rendered by the template of
pytorch/test-infra ``s3_management/manage.py`` (``to_simple_package_html``) for a chosen list of files: nightly
links carry no ``#sha256``, as that template writes them. Both are served by ``lab/recorded_index.py``
(``RecordedPages``).

``--shapes`` records instead the shapes of the real set's big wheels (``lab.wheel_shapes.shape_of``: file counts and
bytes by extension, from each wheel's central directory read with range requests) to ``lab/wheels/shapes.json``,
which the lab's sized wheels copy.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import html
import json
import re
import subprocess
import sys
import urllib.parse
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / ".venv" / "collections"))
sys.path.insert(0, str(REPO))

from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename  # noqa: E402

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


ANCHOR = re.compile(r'<a href="(?P<href>[^"#]*)(?:#sha256=(?P<sha>[0-9a-fA-F]+))?"[^>]*>(?P<name>[^<]*)</a>')


def _git_show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], capture_output=True, text=True, check=True
    ).stdout


def _version_of(filename: str) -> str | None:
    try:
        return str(parse_wheel_filename(filename)[1])
    except InvalidWheelFilename:
        return None


def strip_origins(text: str) -> tuple:
    """Absolute links made host-relative (the path kept): recorded data names no host files are fetched from, as
    the default index's pages keep only ``../../files/<filename>``. Also the number of links changed."""
    return re.subn(r'(<a href=")[a-zA-Z][a-zA-Z0-9+.-]*://[^/"]*(/)', r"\1\2", text)


def trim_page(text: str, keep: set) -> tuple:
    """The page with only the anchors of versions in ``keep`` (every other line as it was); also the count dropped."""
    out, dropped = [], 0
    for line in text.splitlines(keepends=True):
        match = ANCHOR.search(line)
        if match and _version_of(html.unescape(match["name"]).strip()) not in keep:
            dropped += 1
            continue
        out.append(line)
    return "".join(out), dropped


def listed_more_than_once(text: str) -> dict:
    """File name -> the sha256 values the page lists for it, in page order, for names listed more than once."""
    seen = {}
    for match in ANCHOR.finditer(text):
        seen.setdefault(html.unescape(match["name"]).strip(), []).append((match["sha"] or "").lower())
    return {name: hashes for name, hashes in seen.items() if len(hashes) > 1}


def first_listed(git_dir: str, path: str, hashes: list) -> dict:
    """sha256 -> (commit, date) of the first commit of ``path`` whose page lists it: when each entry was published."""
    log = subprocess.run(
        ["git", "--git-dir", git_dir, "log", "--reverse", "--format=%H %cI", "--", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    found = {}
    for line in filter(None, log):
        commit, date = line.split()
        try:
            text = _git_show(git_dir, commit, path)
        except subprocess.CalledProcessError:
            continue
        for sha in hashes:
            if sha not in found and sha in text:
                found[sha] = {"commit": commit, "date": date}
        if len(found) == len(hashes):
            break
    return found


def record_page(out: Path, args) -> dict:
    """One static page of a public repository, as it is there (or trimmed to --keep versions)."""
    blob = None
    if args.git_dir:
        text = _git_show(args.git_dir, args.commit, args.path)
        blob = subprocess.run(
            ["git", "--git-dir", args.git_dir, "rev-parse", f"{args.commit}:{args.path}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        date = subprocess.run(
            ["git", "--git-dir", args.git_dir, "show", "-s", "--format=%cI", args.commit],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    else:
        text, date = Path(args.from_file).read_text(), args.commit_date
    dropped = 0
    if args.keep:
        text, dropped = trim_page(text, set(args.keep))
    text, relative = strip_origins(text)
    project = canonicalize_name(args.projects[0])  # --project: the one project the page lists
    dest = out / "pages" / args.source / project / "index.html"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    doc = {
        "repository": args.repo,
        "path": args.path,
        "commit": args.commit,
        "commit_date": date,
        "read_through": "a git mirror (git show)" if args.git_dir else args.read_through,
        "git_blob": blob,
        "origins": f"{relative} absolute links made host-relative (path kept); nothing else changed",
        "recorded_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "project": project,
        "page": str(dest.relative_to(out)),
        "anchors": len(ANCHOR.findall(text)),
        "trimmed": args.trimmed
        or (
            f"kept the anchors of versions {', '.join(args.keep)} in page order; dropped {dropped} others"
            if args.keep
            else "no"
        ),
        "missing_project_status": args.missing_status,
        "hashless_links": sum(1 for m in ANCHOR.finditer(text) if not m["sha"]),
    }
    repeated = listed_more_than_once(text)
    if repeated:
        doc["republished"] = {name: {"hashes": hashes} for name, hashes in repeated.items()}
    if args.git_dir:
        # When each entry appeared: the date its file was published (the page has no dates of its own).
        listed = [(m["sha"] or "").lower() for m in ANCHOR.finditer(text) if m["sha"]]
        doc["first_listed"] = first_listed(args.git_dir, args.path, listed)
    return doc


def pytorch_package_html(package_name: str, objects: list, timestamp: int) -> str:
    """pytorch/test-infra s3_management/manage.py ``S3Index.to_simple_package_html``, line for line: objects are
    dicts with ``key`` (the S3 key, ``+`` written ``%2B``), ``checksum`` and ``pep658`` (sha256 hex or None). Keys
    under whl/nightly get no ``#sha256`` fragment, whatever their checksum."""
    out = [
        "<!DOCTYPE html>",
        "<html>",
        "  <body>",
        "    <h1>Links for {}</h1>".format(package_name.lower().replace("_", "-")),
    ]
    for obj in sorted(objects, key=lambda o: o["key"]):
        maybe_fragment = (
            f"#sha256={obj['checksum']}" if obj["checksum"] and not obj["key"].startswith("whl/nightly") else ""
        )
        attributes = ""
        if obj["pep658"]:
            pep658_sha = f"sha256={obj['pep658']}"
            attributes = f' data-dist-info-metadata="{pep658_sha}" data-core-metadata="{pep658_sha}"'
        basename = obj["key"].rsplit("/", 1)[-1].replace("%2B", "+")
        out.append(f'    <a href="/{obj["key"]}{maybe_fragment}"{attributes}>{basename}</a><br/>')
    out.append("  </body>")
    out.append("</html>")
    out.append(f"<!--TIMESTAMP {timestamp}-->")
    return "\n".join(out)


# The torch nightlies of January 2026 on PyTorch's nightly cu130 index, by the names its keys have.
PYTORCH_NIGHTLY_DAYS = ("20260113", "20260114", "20260115")
PYTORCH_NIGHTLY_WHEELS = (
    "cp311-cp311-manylinux_2_28_aarch64",
    "cp311-cp311-manylinux_2_28_x86_64",
    "cp312-cp312-manylinux_2_28_aarch64",
    "cp312-cp312-manylinux_2_28_x86_64",
    "cp312-cp312-win_amd64",
)


def record_pytorch_page(out: Path, args) -> dict:
    """torch's page of PyTorch's nightly cu130 index, rendered by manage.py's template. The files' sha256 and METADATA
    hashes are not public (the template drops the first for nightlies); each is the sha256 of the file's name, a
    stand-in the lab replaces with the hashes of the bytes it serves."""
    objects = []
    for day in PYTORCH_NIGHTLY_DAYS:
        for tags in PYTORCH_NIGHTLY_WHEELS:
            key = f"whl/nightly/cu130/torch-2.11.0.dev{day}%2Bcu130-{tags}.whl"
            stand_in = _hashlib_hex(key)
            objects.append({"key": key, "checksum": stand_in, "pep658": _hashlib_hex(key + ".metadata")})
    timestamp = int(_dt.datetime(2026, 1, 15, 12, tzinfo=_dt.timezone.utc).timestamp())
    text = pytorch_package_html("torch", objects, timestamp)
    dest = out / "pages" / args.source / "torch" / "index.html"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    return {
        "repository": "pytorch/test-infra",
        "path": "s3_management/manage.py",
        "commit": args.commit,
        "commit_date": args.commit_date,
        "read_through": "a git mirror (git show); the page is rendered by that file's to_simple_package_html"
        " (scripts/record_index_data.py pytorch_package_html, line for line), not fetched",
        "recorded_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "project": "torch",
        "page": str(dest.relative_to(out)),
        "anchors": len(objects),
        "trimmed": "a chosen set of files: torch 2.11 nightlies of three days, cp311/cp312, x86_64/aarch64/win_amd64",
        "prefix": "whl/nightly/cu130",
        "missing_project_status": 403,
        "hashless_links": len(objects),
        "notes": [
            "nightly links carry no #sha256: manage.py drops the fragment for keys under whl/nightly"
            " (pytorch/test-infra #6307, commit d384c6f501ec3700d8e2e0824e5c60ed8d28ee90, 2025-02-20); other links"
            " lack it when S3 has no usable checksum (a multipart upload's, or none recorded)",
            "data-core-metadata and data-dist-info-metadata carry the METADATA file's sha256 (PEP 658/714);"
            " their values here are stand-ins",
            "hrefs are absolute paths on the index host (/whl/...), the + of a local version written %2B",
            "a project the index does not carry answers HTTP 403, not 404: the pages are objects of an S3 bucket"
            " behind a CDN, and a missing key of a bucket the reader may not list answers AccessDenied",
        ],
    }


def _hashlib_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _save_page_record(out: Path, name: str, doc: dict) -> None:
    path = out / "RECORDED.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    summary.setdefault("pages", {})[name] = doc
    path.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "tests" / "data" / "index"))
    parser.add_argument("--project", action="append", dest="projects", help="project to record (repeatable)")
    parser.add_argument("--metadata", action="append", help="NAME==VERSION whose wheels' METADATA to record")
    parser.add_argument("--shapes", action="store_true", help=f"record the big wheels' shapes to {wheel_shapes.SHAPES}")
    pages = parser.add_argument_group("static pages (--page, --pytorch-page)")
    pages.add_argument("--page", action="store_true", help="record a static PEP 503 page from a git mirror or file")
    pages.add_argument("--pytorch-page", action="store_true", help="render torch's page in PyTorch's index format")
    pages.add_argument("--source", help="name of the recorded index, e.g. sgl-whl-cu130")
    pages.add_argument("--repo", help="owner/name of the public repository holding the page")
    pages.add_argument("--path", help="the page's path in that repository")
    pages.add_argument("--commit", help="the commit it is read at")
    pages.add_argument("--commit-date", help="the commit's date, when read from a file")
    pages.add_argument("--git-dir", help="a git mirror of the repository")
    pages.add_argument("--from-file", help="the page as read, when no git mirror has that commit")
    pages.add_argument("--read-through", default="a file", help="how --from-file was read")
    pages.add_argument("--keep", action="append", help="keep only the anchors of this version (repeatable)")
    pages.add_argument("--trimmed", help="how the page read was already trimmed (with --from-file)")
    pages.add_argument("--missing-status", type=int, default=404, help="what the index answers for other projects")
    args = parser.parse_args(argv)
    if args.page or args.pytorch_page:
        out = Path(args.out)
        doc = record_pytorch_page(out, args) if args.pytorch_page else record_page(out, args)
        _save_page_record(out, args.source, doc)
        print(json.dumps({k: doc[k] for k in ("page", "anchors", "trimmed")}, indent=1))
        return 0
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
    previous = json.loads((out / "RECORDED.json").read_text()) if (out / "RECORDED.json").exists() else {}
    summary = {
        "pages": previous.get("pages", {}),
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
