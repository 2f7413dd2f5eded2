# Copyright: (c) 2026, gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real nginx (Debian's package) on loopback as a site cache: the pull-through cache a site runs near its hosts,
named to the collection by ``gpufleet_fleet_cache_url``.

The collection expects ``<url>/wheels/<wheel file>`` (the lock's wheels) and ``<url>/redist/<manifest
relative_path>`` (the toolkit archives), and checks each file's sha256 on the host. ``start(name)`` renders
``.lab/<name>/site-cache/nginx.conf`` with two servers in one nginx:

- the **site cache** on a free loopback port: ``proxy_cache`` of the wheels and archives (200s only, kept for long:
  their names are immutable, a new build is a new file name), ``proxy_cache_lock on`` so that hosts asking for the
  same missing file at once wait for one upstream fetch; everything else is passed through, never cached;
- the **origin** it fronts, on another loopback port: a plain static server of the controller's verified folders
  (``<controller_dir>/wheelhouse`` under ``/wheels/``, ``<controller_dir>/cache/redist`` under ``/redist/``, dot
  files refused). This is what a site runs upstream of its caches: a stable address over the folders the controller
  fills and verifies, unlike the run's own fleet cache, which lives only while a run does, on a port chosen then.
  Give ``upstream`` instead to front another origin (the origin server is then left out).

Both log one JSON line per request (``access.jsonl``: ``$upstream_cache_status``, bytes sent, bytes received from
upstream; ``origin.access.jsonl``: bytes the origin sent), so hit rate and bytes are counted from the logs
(``counts``). ``nginx -t`` checks the rendered file before start; ``stop(name)`` ends exactly the master process it
started (its pid file, checked against its command line).

    python -m lab.site_cache start --name sc-1 [--controller-dir DIR | --upstream URL] [--port P] [--clear]
    python -m lab.site_cache counts --name sc-1
    python -m lab.site_cache stop --name sc-1
    python -m lab.site_cache render --name sc-1        # the config it would write, nothing started
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import sys
import time
import urllib.parse
from pathlib import Path

from lab import nodes
from lab.common import free_port, log, port_open, run, write_atomic
from lab.haproxy import running_pid

ZONE = "gpufleet_artifacts"
# What the site cache keeps: the files a host pulls, each named once for all time (a wheel's name carries its
# version and tags, an archive's path its version). Manifests, listings and anything else pass through uncached.
CACHED = r"^/(wheels/[^/]+\.whl|redist/.+\.(tar\.xz|tar\.gz|zip))$"
VALID = "365d"
INACTIVE = "90d"
# Hosts of a batch ask for the same missing file at once: all but one wait for its fetch. nginx's default (5 s)
# would send the others upstream uncached while a GB-sized wheel is still arriving.
LOCK_WAIT = "15m"
LOG_FIELDS = {
    "ts": "$msec",
    "client": "$remote_addr",
    "method": "$request_method",
    "path": "$uri",
    "status": "$status",
    "bytes": "$body_bytes_sent",
    "bytes_sent": "$bytes_sent",
    "cache": "$upstream_cache_status",
    "upstream_status": "$upstream_status",
    "upstream_bytes": "$upstream_bytes_received",
    "seconds": "$request_time",
}
ORIGIN_LOG_FIELDS = {k: LOG_FIELDS[k] for k in ("ts", "client", "method", "path", "status", "bytes", "seconds")}


class SiteCacheError(RuntimeError):
    """The site cache cannot be rendered, started or read; the message says why and what to do."""


def site_cache_dir(name: str) -> Path:
    return nodes.lab_dir(name) / "site-cache"


def origin_folders(controller_dir: Path | str) -> dict[str, Path]:
    """The controller folders the collection serves (the lock's wheelhouse, ``cuda_toolkit_cache_dir``'s default)."""
    root = Path(controller_dir)
    return {"wheels": root / "wheelhouse", "redist": root / "cache" / "redist"}


def upstream_parts(url: str) -> tuple[str, str]:
    """``http://host:port/prefix`` -> (``http://host:port``, ``/prefix``); anything else is refused."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.query or parsed.fragment:
        raise SiteCacheError(
            f"site cache: upstream {url!r} is not an http(s) URL of a server; fix: give e.g. http://origin:8080"
            " (the server holding /wheels/ and /redist/ below that path)"
        )
    return f"{parsed.scheme}://{parsed.netloc}", parsed.path.rstrip("/")


def _log_format(name: str, fields: dict[str, str]) -> str:
    body = ",".join(f'"{key}":"{value}"' for key, value in fields.items())
    return f"    log_format {name} escape=json '{{{body}}}';"


def render(
    folder: Path,
    port: int,
    upstream: str,
    origin: dict[str, Path] | None = None,
    origin_port: int | None = None,
    user: str | None = None,
    max_size: str = "20g",
) -> str:
    """nginx.conf of a site cache on 127.0.0.1:``port`` in front of ``upstream`` (with ``origin``: the static
    origin server of those folders on 127.0.0.1:``origin_port``, which ``upstream`` then names)."""
    server, prefix = upstream_parts(upstream)
    # A regex location passes the request URI as is; an upstream below a path gets it prepended.
    rewrite = [f"            rewrite ^(.*)$ {prefix}$1 break;"] if prefix else []
    tmp = folder / "tmp"
    lines = [
        "# Rendered by lab/site_cache.py (python -m lab.site_cache); rewritten on every start.",
        *([f"user {user};"] if user else []),
        "worker_processes auto;",
        f"pid {folder / 'nginx.pid'};",
        f"error_log {folder / 'error.log'} warn;",
        "events { worker_connections 1024; }",
        "",
        "http {",
        "    default_type application/octet-stream;",
        "    sendfile on;",
        "    tcp_nopush on;",
        "    server_tokens off;",
        *(f"    {kind}_temp_path {tmp / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")),
        _log_format("gpufleet_cache", LOG_FIELDS),
        *([_log_format("gpufleet_origin", ORIGIN_LOG_FIELDS)] if origin else []),
        # Cache files are written beside their final place (use_temp_path=off): a finished fetch is one rename.
        f"    proxy_cache_path {folder / 'cache'} levels=1:2 keys_zone={ZONE}:10m max_size={max_size}"
        f" inactive={INACTIVE} use_temp_path=off;",
        "",
        "    # The site cache: what the hosts reach (gpufleet_fleet_cache_url).",
        "    server {",
        f"        listen 127.0.0.1:{port};",
        f"        access_log {folder / 'access.jsonl'} gpufleet_cache;",
        "        proxy_http_version 1.1;",
        '        proxy_set_header Connection "";',
        "        location / {",
        f"            proxy_pass {server}{prefix}/;",
        "        }",
        f"        location ~ {CACHED} {{",
        *rewrite,
        f"            proxy_pass {server};",
        f"            proxy_cache {ZONE};",
        "            proxy_cache_key $uri;",
        f"            proxy_cache_valid 200 {VALID};",
        # An origin's Cache-Control or Expires must not shorten what the file name makes immutable.
        "            proxy_ignore_headers Cache-Control Expires Set-Cookie;",
        "            proxy_cache_lock on;",
        f"            proxy_cache_lock_timeout {LOCK_WAIT};",
        f"            proxy_cache_lock_age {LOCK_WAIT};",
        "            proxy_cache_use_stale error timeout updating http_500 http_502 http_503 http_504;",
        "            add_header X-Cache-Status $upstream_cache_status always;",
        "        }",
        "    }",
    ]
    if origin:
        lines += [
            "",
            "    # The origin: the controller's verified folders, served as they are.",
            "    server {",
            f"        listen 127.0.0.1:{origin_port};",
            f"        access_log {folder / 'origin.access.jsonl'} gpufleet_origin;",
            "        location ~ /\\. { return 404; }",
            *(f"        location /{mount}/ {{ alias {path}/; }}" for mount, path in sorted(origin.items())),
            "        location / { return 404; }",
            "    }",
        ]
    return "\n".join([*lines, "}"]) + "\n"


def _owner(path: Path) -> str:
    """The user owning ``path`` or its nearest existing parent: the origin's workers read what the controller wrote
    (its wheelhouse files are private to it)."""
    while not path.exists():
        path = path.parent
    return pwd.getpwuid(path.stat().st_uid).pw_name


def _nginx() -> str:
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if binary is None:
        raise SiteCacheError("nginx is not installed; run scripts/setup.sh (apt-get install nginx-light)")
    return binary


def _ours(pid: int | None, config: Path) -> bool:
    """Whether ``pid`` is the nginx master of ``config`` (not a process that got a dead master's pid since)."""
    try:
        return pid is not None and str(config) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def plan(
    name: str,
    controller_dir: Path | str | None = None,
    upstream: str | None = None,
    port: int | None = None,
    folder: Path | None = None,
) -> dict:
    """What ``start`` would run: folder, ports, upstream, origin folders and the rendered config."""
    folder = Path(folder or site_cache_dir(name))
    port = port or free_port()
    origin = origin_port = None
    if upstream is None:
        origin = origin_folders(controller_dir or nodes.lab_dir(name) / "controller")
        origin_port = free_port({port})
        upstream = f"http://127.0.0.1:{origin_port}"
    user = _owner(next(iter(origin.values()))) if origin and os.geteuid() == 0 else None
    text = render(folder, port, upstream, origin, origin_port, user)
    return {
        "folder": folder,
        "port": port,
        "url": f"http://127.0.0.1:{port}",
        "upstream": upstream,
        "origin": origin,
        "origin_port": origin_port,
        "config": text,
    }


def start(
    name: str,
    controller_dir: Path | str | None = None,
    upstream: str | None = None,
    port: int | None = None,
    folder: Path | None = None,
    clear: bool = False,
) -> dict:
    """Render, check (``nginx -t``) and run the site cache of ``name``; one this lab already runs is replaced. The
    cache itself survives a restart unless ``clear`` (a cold start)."""
    binary = _nginx()
    planned = plan(name, controller_dir, upstream, port, folder)
    folder = planned["folder"]
    stop(name, folder)
    if clear:
        shutil.rmtree(folder / "cache", ignore_errors=True)
    for sub in ("cache", "tmp"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    config = folder / "nginx.conf"
    write_atomic(config, planned["config"], mode=0o644)
    check = run([binary, "-t", "-q", "-p", str(folder), "-c", str(config)], check=False, capture=True)
    if check.returncode != 0:
        raise SiteCacheError(f"site cache {name}: nginx -t refused {config}: {check.stderr.strip()}")
    run([binary, "-p", str(folder), "-c", str(config)], capture=True)
    ports = [planned["port"]] + ([planned["origin_port"]] if planned["origin_port"] else [])
    deadline = time.monotonic() + 10
    while not all(port_open(p) for p in ports):
        if time.monotonic() > deadline:
            raise SiteCacheError(f"site cache {name}: nginx did not listen on {ports} in 10 s; see {folder}/error.log")
        time.sleep(0.1)
    info = {
        "url": planned["url"],
        "port": planned["port"],
        "upstream": planned["upstream"],
        "origin": {k: str(v) for k, v in (planned["origin"] or {}).items()} or None,
        "config": str(config),
        "access_log": str(folder / "access.jsonl"),
        "origin_log": str(folder / "origin.access.jsonl") if planned["origin"] else None,
        "pid": running_pid(folder / "nginx.pid"),
    }
    write_atomic(folder / "site-cache.json", json.dumps(info, indent=2) + "\n")
    log(f"lab {name}: site cache (nginx) on {info['url']} in front of {info['upstream']}")
    return info


def stop(name: str, folder: Path | None = None, timeout: float = 10.0) -> bool:
    """End the nginx this lab started (its pid file, the master of this folder's config); True when one ran."""
    folder = Path(folder or site_cache_dir(name))
    pid_file, config = folder / "nginx.pid", folder / "nginx.conf"
    pid = running_pid(pid_file)
    if not _ours(pid, config):
        return False
    os.kill(pid, signal.SIGTERM)  # nginx's fast shutdown: the master ends its workers, then itself
    deadline = time.monotonic() + timeout
    while _ours(running_pid(pid_file), config):
        if time.monotonic() > deadline:
            raise SiteCacheError(f"site cache {name}: nginx {pid} did not end in {timeout:.0f} s")
        time.sleep(0.1)
    return True


def read_log(path: Path | str, since: float = 0.0) -> list[dict]:
    """The JSON lines of an access log written at or after ``since`` (numbers as numbers)."""
    rows = []
    path = Path(path)
    if not path.exists():
        return rows
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        for key in ("ts", "status", "bytes", "bytes_sent", "seconds"):
            row[key] = _number(row.get(key))
        if row["ts"] >= since:
            rows.append(row)
    return rows


def _number(value) -> float | int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0
    return int(number) if number.is_integer() else number


def upstream_bytes(value: str) -> int:
    """``$upstream_bytes_received``: empty or ``-`` without an upstream, one number per upstream tried (``a, b``,
    ``a : b`` after an internal redirect)."""
    return sum(int(part) for part in str(value or "").replace(":", ",").split(",") if part.strip().isdigit())


def counts(cache_rows: list[dict], origin_rows: list[dict] | None = None) -> dict:
    """Requests per cache status, hit rate (HIT over all requests and over bytes served), bytes served to hosts,
    bytes fetched from the upstream (as nginx received them, headers included) and, with the origin's log, the
    bytes the origin sent."""
    by_status: dict[str, dict] = {}
    for row in cache_rows:
        status = row.get("cache") or "NONE"  # a request nginx answered without the cache (passed through, 404)
        entry = by_status.setdefault(status, {"requests": 0, "bytes": 0})
        entry["requests"] += 1
        entry["bytes"] += row["bytes"]
    served = sum(row["bytes"] for row in cache_rows)
    hits = by_status.get("HIT", {"requests": 0, "bytes": 0})
    out = {
        "requests": len(cache_rows),
        "by_cache_status": dict(sorted(by_status.items())),
        "hit_rate": round(hits["requests"] / len(cache_rows), 3) if cache_rows else None,
        "byte_hit_rate": round(hits["bytes"] / served, 3) if served else None,
        "served_bytes": served,
        "errors": sum(1 for row in cache_rows if row["status"] >= 400),
        "upstream_bytes": sum(upstream_bytes(row.get("upstream_bytes")) for row in cache_rows),
    }
    if origin_rows is not None:
        out["origin_requests"] = len(origin_rows)
        out["origin_bytes"] = sum(row["bytes"] for row in origin_rows)
    return out


def read_counts(name: str, since: float = 0.0, folder: Path | None = None) -> dict:
    folder = Path(folder or site_cache_dir(name))
    origin_log = folder / "origin.access.jsonl"
    origin = read_log(origin_log, since) if origin_log.exists() else None
    return counts(read_log(folder / "access.jsonl", since), origin)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.site_cache", description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["start", "stop", "counts", "render"])
    ap.add_argument("--name", default="lab")
    ap.add_argument("--port", type=int)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--controller-dir", help="the origin's folders: <dir>/wheelhouse, <dir>/cache/redist")
    where.add_argument("--upstream", help="front this origin instead (http://host:port[/path])")
    ap.add_argument("--clear", action="store_true", help="start with an empty cache")
    args = ap.parse_args(argv)
    try:
        if args.action == "start":
            out = start(args.name, args.controller_dir, args.upstream, args.port, clear=args.clear)
        elif args.action == "stop":
            out = {"stopped": stop(args.name)}
        elif args.action == "counts":
            out = read_counts(args.name)
        else:
            print(plan(args.name, args.controller_dir, args.upstream, args.port)["config"], end="")
            return 0
    except RuntimeError as exc:  # SiteCacheError, or a command that failed (its output included)
        log(f"error: {exc}")
        return 1
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
