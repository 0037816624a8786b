"""The wheels as a user installs them: built once per session with the venv's setuptools, then
``yeto-core[testing]``, ``yeto-miles``, ``yeto-modal`` and the example third-party plugin
installed in a fresh venv (``python -m venv``; pip fetches their third-party dependencies).

Checked there: each wheel's LICENSE, ``py.typed`` and README links (the README is the
description in the wheel's METADATA), the entry points (``yeto plugins --json`` in that venv),
and yeto's ObjectStore contract suite, run from the installed ``yeto-core[testing]`` against the
example plugin's store by pytest inside the venv.
"""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from dists import DISTS, EXAMPLE, REPOSITORY, ROOT

pytestmark = pytest.mark.slow

LICENSE = (ROOT / "LICENSE").read_text()


def clean_env() -> dict[str, str]:
    """This process's environment without what points Python at the checkout's sources."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    env.pop("YETO_DISABLE_PLUGINS", None)
    return env


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> dict[str, Path]:
    """Every distribution's wheel and the example plugin's, built once (``make wheels``' way)."""
    out = tmp_path_factory.mktemp("wheels")
    trees = tmp_path_factory.mktemp("trees")  # copies: the builds leave nothing in the checkout
    skip = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.pyc")
    for d in (*DISTS, EXAMPLE):
        shutil.copytree(ROOT / d, trees / d, ignore=skip)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps"]
        + ["--no-build-isolation", "-w", str(out)]
        + [str(trees / d) for d in (*DISTS, EXAMPLE)],
        check=True,
        cwd=out,
    )
    wheels = {w.name.split("-")[0]: w for w in out.glob("*.whl")}
    assert len(wheels) == len(DISTS) + 1, sorted(wheels)
    return wheels


@pytest.fixture(scope="session")
def fresh_venv(wheelhouse, tmp_path_factory) -> Path:
    """A new venv with yeto-core[testing], yeto-miles, yeto-modal and the example plugin."""
    where = tmp_path_factory.mktemp("venv") / "v"
    venv.EnvBuilder(with_pip=False).create(where)  # this pip installs into it (--python)
    py = where / "bin" / "python"
    want = ["yeto_core", "yeto_miles", "yeto_modal", "yeto_example_memory"]
    files = [str(wheelhouse[n]) for n in want]
    files[0] += "[testing]"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q"]
        + ["--disable-pip-version-check", *files],
        check=True,
        env=clean_env(),
    )
    return where


def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(z.read(name))


def test_each_wheel_holds_the_license_and_py_typed(wheelhouse):
    for wheel in wheelhouse.values():
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            licenses = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
            assert licenses, f"{wheel.name} has no LICENSE"
            assert z.read(licenses[0]).decode() == LICENSE
            packages = {n.split("/")[0] for n in names if n.endswith("/__init__.py")}
            assert packages, wheel.name
            for package in packages:
                assert f"{package}/py.typed" in names, f"{wheel.name}: {package} lacks py.typed"
        meta = metadata(wheel)
        assert meta["License-Expression"] == "Apache-2.0", wheel.name
        assert "Classifier" in meta and "Typing :: Typed" in meta.get_all("Classifier")


LINK = re.compile(r"\]\(([^)\s]+)\)|<(https?://[^>]+)>|\bsrc=\"([^\"]+)\"")


def test_readmes_in_the_metadata_link_absolutely(wheelhouse):
    for wheel in wheelhouse.values():
        meta = metadata(wheel)
        urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or ())
        assert urls.get("Repository") == REPOSITORY, (wheel.name, urls)
        assert meta["Description-Content-Type"] == "text/markdown", wheel.name
        description = meta.get_payload()
        assert description.strip(), f"{wheel.name} has no README in its metadata"
        links = [next(g for g in m.groups() if g) for m in LINK.finditer(description)]
        relative = [link for link in links if not link.startswith("https://")]
        assert not relative, f"{wheel.name}'s README has relative links {relative}"


def test_entry_points_list_the_installed_plugins(fresh_venv):
    out = subprocess.run(
        [str(fresh_venv / "bin" / "yeto"), "plugins", "--json"],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    )
    plugins = {p["name"]: p for p in json.loads(out.stdout)}
    assert {"core", "miles", "modal", "example-memory"} <= set(plugins), sorted(plugins)
    assert "torch" not in plugins  # only what this venv installed
    for name in ("miles", "modal", "example-memory"):
        assert plugins[name]["error"] is None, plugins[name]
    assert plugins["example-memory"]["provides"]["ObjectStore"] == ["memory"]
    assert plugins["modal"]["provides"]["IslandProvider"] == ["modal"]
    assert plugins["miles"]["distribution"] == "yeto-miles"


CONTRACT_TEST = """
import uuid

import pytest

from yeto_core.testing.store_contract import ObjectStoreContract
from yeto_example_memory import MemoryStore


class TestMemoryStore(ObjectStoreContract):
    @pytest.fixture
    def store(self):
        return MemoryStore(f"contract-{uuid.uuid4().hex}")
"""


def test_the_contract_suite_runs_from_the_testing_extra_against_the_example(fresh_venv, tmp_path):
    (tmp_path / "test_memory_contract.py").write_text(CONTRACT_TEST)
    out = subprocess.run(
        [str(fresh_venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + ["test_memory_contract.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    summary = out.stdout.strip().splitlines()[-1]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= 50 and "failed" not in summary, summary
    # the suite ran from the venv's installed yeto-core, not from this checkout
    where = subprocess.run(
        [str(fresh_venv / "bin" / "python"), "-c", "import yeto_core; print(yeto_core.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    ).stdout.strip()
    assert where.startswith(str(fresh_venv)), where
