"""The run's own yeto distributions: which an island needs, their wheels, and the version lock.

A remote island (a Modal container, a SkyPilot cluster) must run the same yeto as the
head. Its provider asks :func:`island_modules` what an island of a role imports,
:func:`run_distributions` which distributions install those modules and how each can be
shipped (:class:`Shipped`): a wheel **built at launch** from the source tree the head
imports it from, the wheel file it was installed from, or, only for a distribution the
head installed from a package index, that exact version from the index. :func:`build_wheels`
builds (or copies) the wheels into a directory the provider uploads.

The versions travel to the island in ``YETO_VERSIONS`` (:func:`lock_env`); the island
checks them before anything else (:func:`check_version_lock`) and refuses to start, naming
both versions, when what is installed there differs from the run's.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

import attrs

from yeto_core.errors import ConfigError
from yeto_core.providers.env import ENV_VERSIONS  # the run's {distribution: version}, JSON

#: Where built wheels are kept between launches (keyed by the source tree's content).
ENV_WHEEL_CACHE = "YETO_WHEEL_CACHE"

#: How a distribution reaches the island.
BUILD, FILE, INDEX = "build", "file", "index"


@attrs.frozen
class Shipped:
    """One distribution of the run and how it reaches an island."""

    dist: str
    version: str
    how: str  # BUILD (from ``source``, a source tree), FILE (``source``, a wheel), INDEX
    source: str = ""

    @property
    def wheel(self) -> str:
        """The wheel's file name (for BUILD and FILE)."""
        if self.how == FILE:
            return Path(self.source).name
        return f"{normalize(self.dist).replace('-', '_')}-{self.version}-py3-none-any.whl"

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


def normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def island_modules(config: Any, plugins: Any, role: str, implementation: str) -> list[str]:
    """The top-level modules an island of ``role`` imports: the core, the task's, the
    store's, and the engine's (a sampler) or the trainer backend's (the trainer)."""
    port = "TrainerBackend" if role == "trainer" else "SamplerEngine"
    modules = [
        "yeto_core",
        plugins.resolve("Task", config.task.name).__module__,
        plugins.store_class_for_url(config.store_url()).__module__,
        plugins.resolve(port, implementation).__module__,
    ]
    return sorted({m.split(".")[0] for m in modules})


def _project_dir(module: str, dist: str) -> Optional[Path]:
    """The source tree (a pyproject.toml naming ``dist``) ``module`` is imported from."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return None
    here = Path(spec.origin).resolve().parent
    for d in list(here.parents)[:4]:
        pyproject = d / "pyproject.toml"
        if pyproject.is_file():
            name = re.search(r'^name\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)
            if name and normalize(name.group(1)) == normalize(dist):
                return d
            return None
    return None


def _static_version(project: Path) -> Optional[str]:
    m = re.search(r'^version\s*=\s*"([^"]+)"', (project / "pyproject.toml").read_text(), re.M)
    return m.group(1) if m else None


def _installed_wheel(dist: str) -> Optional[str]:
    """The wheel file ``dist`` was installed from (PEP 610 ``direct_url.json``), if it exists."""
    try:
        raw = md.distribution(dist).read_text("direct_url.json")
    except md.PackageNotFoundError:
        return None
    if not raw:
        return None
    info = json.loads(raw)
    url = str(info.get("url", ""))
    if "archive_info" in info and url.startswith("file://") and url.endswith(".whl"):
        path = url.removeprefix("file://")
        return path if os.path.isfile(path) else None
    return None


@functools.lru_cache(maxsize=1)
def _owners() -> Mapping[str, list[str]]:
    """Top-level module -> distributions (a scan of every installed one: done once)."""
    return md.packages_distributions()


def run_distributions(modules: Iterable[str]) -> list[Shipped]:
    """The distributions that install ``modules`` (top-level names), each with its version
    and how it is shipped, sorted by name.

    :raises ConfigError: a module no installed distribution provides.
    """
    owners = _owners()
    out: dict[str, Shipped] = {}
    for module in modules:
        top = module.split(".")[0]
        dists = owners.get(top)
        if not dists:
            raise ConfigError(
                f"module {top!r} comes from no installed distribution, so it cannot be shipped "
                "to an island; install it (pip install -e its folder) on the head"
            )
        dist = md.metadata(dists[0])["Name"]
        if dist in out:
            continue
        project = _project_dir(top, dist)
        if project is not None:
            version = _static_version(project) or md.version(dist)
            out[dist] = Shipped(dist, version, BUILD, str(project))
        elif (wheel := _installed_wheel(dist)) is not None:
            out[dist] = Shipped(dist, md.version(dist), FILE, wheel)
        else:
            out[dist] = Shipped(dist, md.version(dist), INDEX)
    return sorted(out.values(), key=lambda s: normalize(s.dist))


def versions(shipped: Iterable[Shipped]) -> dict[str, str]:
    return {s.dist: s.version for s in shipped}


def lock_env(shipped: Iterable[Shipped]) -> str:
    """The value of ``YETO_VERSIONS`` for these distributions."""
    return json.dumps(versions(shipped), sort_keys=True)


def check_version_lock(env: Mapping[str, str], island: str = "") -> dict[str, str]:
    """Compare ``YETO_VERSIONS`` with the distributions installed in this process's Python.

    :returns: the run's versions (empty when the variable is not set: a local island).
    :raises ConfigError: naming each distribution whose version differs, both versions.
    """
    raw = env.get(ENV_VERSIONS)
    if not raw:
        return {}
    try:
        want = {str(k): str(v) for k, v in json.loads(raw).items()}
    except (ValueError, AttributeError):
        raise ConfigError(f"{ENV_VERSIONS}={raw!r} is not a JSON object of versions") from None
    wrong = []
    for dist, version in sorted(want.items()):
        try:
            have = md.version(dist)
        except md.PackageNotFoundError:
            have = "not installed"
        if have != version:
            wrong.append(f"{dist} {have} here, {version} in the run")
    if wrong:
        who = f"island {island}" if island else "this island"
        raise ConfigError(
            f"{who} refuses to start: its yeto distributions differ from the run's: "
            + "; ".join(wrong)
            + ". Install the run's versions on the island (the provider ships the run's own "
            "wheels unless told to use an index or the image's), or run the head with the "
            "versions the island has"
        )
    return want


def tree_digest(project: Path) -> str:
    """A digest of a source tree's files (sources, pyproject, README, LICENSE)."""
    h = hashlib.sha256()
    skip = {"build", "dist", "__pycache__", ".pytest_cache"}
    for root, dirs, files in os.walk(project):
        dirs[:] = sorted(d for d in dirs if d not in skip and not d.endswith(".egg-info"))
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = Path(root) / name
            h.update(str(path.relative_to(project)).encode() + b"\0")
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get(ENV_WHEEL_CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "yeto", "wheels"
    )
    return Path(base)


def _build(shipped: Shipped) -> Path:
    """The wheel of a source tree, from the cache when that tree was built before."""
    project = Path(shipped.source)
    slot = cache_dir() / f"{shipped.wheel[: -len('.whl')]}-{tree_digest(project)}"
    wheel = slot / shipped.wheel
    if wheel.is_file():
        return wheel
    slot.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=slot.parent) as tmp:
        src = Path(tmp) / "src"  # a copy: the build leaves nothing in the source tree
        shutil.copytree(
            project,
            src,
            ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.pyc"),
        )
        out = Path(tmp) / "out"
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check"]
            + ["--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
            capture_output=True,
            text=True,
        )
        built = out / shipped.wheel
        if proc.returncode != 0 or not built.is_file():
            found = sorted(p.name for p in out.glob("*.whl")) if out.is_dir() else []
            raise ConfigError(
                f"cannot build the wheel of {shipped.dist} {shipped.version} from {project} "
                f"(expected {shipped.wheel}, got {found or 'nothing'}): "
                f"{(proc.stderr or proc.stdout).strip()[-1500:]}. The head needs pip and the "
                "build backend of its pyproject.toml (setuptools) installed"
            )
        staged = Path(tmp) / "slot"
        staged.mkdir()
        shutil.move(str(built), staged / shipped.wheel)
        try:
            os.replace(staged, slot)  # atomic: a concurrent build of the same tree wins alike
        except OSError:
            if not wheel.is_file():
                raise
    return wheel


def build_wheels(shipped: Iterable[Shipped], out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """The wheel of every BUILD or FILE distribution, in ``out_dir``: ``{dist: path}``.

    Built with this Python's pip and build backend, without an isolated build environment
    (nothing is downloaded); a tree built before is taken from the cache (``YETO_WHEEL_CACHE``,
    default ``~/.cache/yeto/wheels``) when its files are unchanged.

    :raises ConfigError: a build failed (its output is in the message).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for s in shipped:
        if s.how == INDEX:
            continue
        source = _build(s) if s.how == BUILD else Path(s.source)
        target = out / s.wheel
        tmp = out / f".{s.wheel}.tmp"
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
        paths[s.dist] = target
    return paths
