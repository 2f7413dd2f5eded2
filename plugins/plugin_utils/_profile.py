# -*- coding: utf-8 -*-
# Copyright: gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stack profiles: find, load, validate (JSON Schema) and apply site overrides. Controller side only."""

from __future__ import annotations

import configparser
import copy
import hashlib
import os
import re
from pathlib import Path

import yaml
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpufleet.upgrade.plugins.module_utils import _server

try:
    import jsonschema
except ImportError:  # pragma: no cover - reported by load_profile
    jsonschema = None

COLLECTION_ROOT = Path(__file__).resolve().parents[2]
STACKS_DIR = COLLECTION_ROOT / "stacks"
SCHEMA_PATH = STACKS_DIR / "schema" / "stack-profile.schema.yml"


class ProfileError(Exception):
    """A profile that cannot be used; the message says which field and how to fix it."""


def field_path(parts) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def find_profile(name: str | None, path: str | None, search_dirs=()) -> Path:
    if path:
        candidate = Path(path).expanduser()
        if not candidate.is_file():
            raise ProfileError(f"stack profile file {path!r} does not exist; pass an existing YAML file")
        return candidate
    if not name:
        raise ProfileError(
            "no stack profile given; set gpufleet_stack_profile to a profile name (e.g. cu130) or a path"
        )
    dirs = [Path(d).expanduser() for d in search_dirs] + [STACKS_DIR]
    for directory in dirs:
        candidate = directory / f"{name}.yml"
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for d in dirs if d.is_dir() for p in d.glob("*.yml"))
    raise ProfileError(
        f"stack profile {name!r} not found in {', '.join(str(d) for d in dirs)};"
        f" known profiles: {', '.join(known) or 'none'}"
    )


def validate(profile) -> list[str]:
    """Return one message per schema violation, each naming the field's path."""
    if jsonschema is None:
        raise ProfileError("the controller lacks the Python package 'jsonschema'; install it next to ansible-core")
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(profile), key=lambda e: list(e.absolute_path))
    messages = [f"{field_path(e.absolute_path)}: {e.message}" for e in errors]
    if not messages:
        messages = _cross_field_errors(profile)
    return messages


def _cross_field_errors(profile) -> list[str]:
    messages = []
    wheels = profile["wheels"]
    index_names = {i["name"] for i in wheels["indexes"]}
    package_names = {p["name"] for p in wheels["packages"]}
    for n, pkg in enumerate(wheels["packages"]):
        for index in pkg["indexes"]:
            if index not in index_names:
                messages.append(
                    f"wheels.packages[{n}].indexes: index {index!r} of package {pkg['name']!r} is not declared in"
                    f" wheels.indexes (declared: {', '.join(sorted(index_names))})"
                )
    for n, group in enumerate(wheels["rules"].get("same_version", [])):
        for name in group:
            if name not in package_names:
                messages.append(f"wheels.rules.same_version[{n}]: {name!r} is not one of wheels.packages")
    messages += _lock_rule_errors(wheels, index_names, package_names)
    messages += _serving_env_errors(profile)
    method = profile["cuda"]["install_method"]
    if method not in profile["cuda"]["sources"]:
        messages.append(f"cuda.sources: install_method is {method!r} but cuda.sources.{method} is missing")
    return messages


def _serving_env_errors(profile) -> list[str]:
    """serving.env must not set a variable that acts by its mere presence (_server.PRESENCE_FLAGS, with the reason)."""
    return [
        f"serving.env.{flag['name']}: profile {profile.get('name')!r} sets it to {flag['value']!r}, but"
        f" {_server.presence_flag_message(flag)}; fix: remove {flag['name']} from serving.env (unset is the only"
        " way to keep the default)"
        for flag in _server.presence_flags((profile.get("serving") or {}).get("env") or {})
    ]


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock_rule_errors(wheels, index_names, package_names) -> list[str]:
    """wheels.dependency_indexes, rules.companions and rules.cuda_exceptions against the rest of the profile."""
    messages = []
    profile_keys = {_canon(n) for n in package_names}
    for name, index in (wheels.get("dependency_indexes") or {}).items():
        if index not in index_names:
            messages.append(
                f"wheels.dependency_indexes.{name}: index {index!r} is not declared in wheels.indexes"
                f" (declared: {', '.join(sorted(index_names))})"
            )
        if _canon(name) in profile_keys:
            messages.append(
                f"wheels.dependency_indexes.{name}: {name!r} is a profile package; give its indexes in"
                " wheels.packages instead"
            )
    for key in ("companions", "cuda_exceptions"):
        seen = set()
        for n, entry in enumerate(wheels["rules"].get(key, [])):
            package = _canon(entry["package"])
            if package in seen:
                messages.append(f"wheels.rules.{key}[{n}]: a second entry for {entry['package']!r}; keep one")
            seen.add(package)
            if key == "companions" and package == _canon(entry.get("with", "torch")):
                messages.append(f"wheels.rules.companions[{n}]: {entry['package']!r} cannot pair with itself")
    return messages


def default_index_url() -> str:
    """The controller's configured default index (pip's configuration, then pip's own default)."""
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(var):
            return os.environ[var]
    for conf in _pip_config_files():
        parser = configparser.ConfigParser()
        try:
            parser.read(conf)
        except configparser.Error:
            continue
        for section in ("global", "install"):
            if parser.has_option(section, "index-url"):
                return parser.get(section, "index-url")
    try:
        from pip._internal.models.index import PyPI  # pip's own notion of the default index

        return PyPI.simple_url
    except ImportError as exc:
        raise ProfileError(
            "a profile index uses url 'default' but the controller has no pip configuration to read it from;"
            " set PIP_INDEX_URL or give the index an explicit url"
        ) from exc


def _pip_config_files():
    env = os.environ.get("PIP_CONFIG_FILE")
    if env:
        return [env]
    home = Path.home()
    return ["/etc/pip.conf", "/etc/xdg/pip/pip.conf", str(home / ".pip/pip.conf"), str(home / ".config/pip/pip.conf")]


def apply_overrides(profile, index_urls=None, redist_url=None):
    """Site overrides (mirrors): index name -> URL (or {url, files}: ``_mirror``), and the redist mirror URL."""
    out = copy.deepcopy(profile)
    index_urls = index_urls or {}
    known = {i["name"] for i in out["wheels"]["indexes"]}
    unknown = sorted(set(index_urls) - known)
    if unknown:
        raise ProfileError(
            f"gpufleet_index_urls names unknown index(es) {', '.join(unknown)} for profile {out['name']!r};"
            f" known: {', '.join(sorted(known))}"
        )
    for index in out["wheels"]["indexes"]:
        if index["name"] in index_urls:
            _mirror(index, index_urls[index["name"]])
        if index["url"] == "default":
            index["url"] = default_index_url()
            index["is_default"] = True
    if redist_url:
        out["cuda"]["sources"].setdefault("redist", {})["url"] = redist_url
    return out


def _mirror(index: dict, mirror) -> None:
    """A site mirror in place of ``index``: ``mirror`` is its URL, or {url, files}. The mirror serves the index's
    files itself unless the site says where (``files``): the profile's ``files`` name where the original index links
    them, which a mirror's pages do not."""
    name = index["name"]
    fix = (
        f"fix: set gpufleet_index_urls.{name} to the mirror's URL, or to {{url: <mirror URL>, files: [<URL prefix"
        " where its pages link the wheel files>, ...]}"
    )
    if isinstance(mirror, dict):
        unknown = sorted(set(mirror) - {"url", "files"})
        url, files = mirror.get("url"), mirror.get("files")
    else:
        unknown, url, files = [], mirror, None
    if unknown or not isinstance(url, str) or not url:
        raise ProfileError(f"gpufleet_index_urls.{name} is {mirror!r}: not a URL nor {{url, files}}; {fix}")
    if files is not None and (not isinstance(files, list) or not files or not all(_http_prefix(f) for f in files)):
        raise ProfileError(
            f"gpufleet_index_urls.{name}.files is {files!r}: not a list of http(s) URL prefixes (scheme://host/...);"
            f" {fix}"
        )
    index["url"] = url
    index["site_mirror"] = True
    if files is not None:
        index["files"] = list(files)
    else:
        index.pop("files", None)  # the default: the mirror's own origin


def _http_prefix(value) -> bool:
    return isinstance(value, str) and re.fullmatch(r"https?://[^/@\s]+/\S*", value) is not None


def load_profile(name=None, path=None, search_dirs=(), index_urls=None, redist_url=None):
    source = find_profile(name, path, search_dirs)
    raw = source.read_bytes()
    try:
        profile = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ProfileError(f"stack profile {source} is not valid YAML: {exc}") from exc
    if not isinstance(profile, dict):
        raise ProfileError(f"stack profile {source} must be a mapping at the top level")
    errors = validate(profile)
    if errors:
        raise ProfileError(f"stack profile {source} is invalid: " + "; ".join(errors))
    profile = apply_overrides(profile, index_urls, redist_url)
    profile["source"] = {"path": str(source), "sha256": hashlib.sha256(raw).hexdigest()}
    return profile


def host_settings(profile, serving_port=None, gpu_required=None) -> dict:
    """The host's serving port (int) and whether it must have a GPU (bool): its inventory's value, else the profile's.
    ValueError names the variable, the value and the fix."""
    port = profile["serving"]["port"] if serving_port in (None, "") else serving_port
    try:
        port = int(port)
    except (TypeError, ValueError):
        port = None
    if port is None or not 0 < port < 65536:
        raise ValueError(
            f"gpufleet_serving_port={serving_port!r} is not a TCP port; set it to a number from 1 to 65535 "
            "in the inventory, or remove it to use the profile's serving.port"
        )
    required = profile["gpu"]["required"] if gpu_required in (None, "") else gpu_required
    try:
        required = boolean(required, strict=True)
    except TypeError:
        raise ValueError(
            f"gpufleet_gpu_required={gpu_required!r} is not a boolean; set it to true or false in the inventory, "
            "or remove it to use the profile's gpu.required"
        ) from None
    return {"gpufleet_serving_port": port, "gpufleet_gpu_required": required}
