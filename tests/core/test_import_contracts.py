"""The import-linter contracts hold, and they catch a bad import (not only the happy path)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINT = pathlib.Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed")


def _lint(pythonpath: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [str(LINT), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _scratch_copy(tmp_path: pathlib.Path, package: str, src: pathlib.Path, bad: str) -> None:
    dest = tmp_path / package
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "_scratch_bad_import.py").write_text(f"{bad}\n")


def test_contracts_hold_on_the_tree():
    result = _lint()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("bad", ["import boto3", "import torch", "from yeto_s3 import plugin"])
def test_core_importing_an_sdk_or_adapter_is_caught(tmp_path, bad):
    _scratch_copy(tmp_path, "yeto_core", ROOT / "yeto_core/src/yeto_core", bad)
    result = _lint(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "yeto_core imports no adapter distribution" in result.stdout
    assert "BROKEN" in result.stdout and "_scratch_bad_import" in result.stdout


def test_adapter_importing_another_adapter_is_caught(tmp_path):
    _scratch_copy(
        tmp_path, "yeto_s3", ROOT / "plugins/yeto-s3/src/yeto_s3", "import yeto_torch.plugin"
    )
    result = _lint(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "adapter distributions never import each other" in result.stdout
    assert "BROKEN" in result.stdout


def test_a_lower_layer_importing_a_higher_one_is_caught(tmp_path):
    """records.py importing the head breaks the layers contract."""
    dest = tmp_path / "yeto_core"
    shutil.copytree(
        ROOT / "yeto_core/src/yeto_core", dest, ignore=shutil.ignore_patterns("__pycache__")
    )
    records = dest / "records.py"
    records.write_text(records.read_text() + "\nfrom yeto_core.head import run  # noqa\n")
    result = _lint(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "yeto_core layers" in result.stdout and "BROKEN" in result.stdout


@pytest.mark.parametrize(
    ("module", "bad"),
    [
        ("ports/base.py", "from yeto_core.buffer import ledger"),
        ("hookspecs.py", "from yeto_core.stores import dir_store"),
    ],
)
def test_the_kernel_importing_the_rest_of_the_core_is_caught(tmp_path, module, bad):
    """A kernel module (ports, hookspecs, records, errors, serde, the registry) importing a role
    subpackage breaks the kernel contract, even where the layers would allow it."""
    dest = tmp_path / "yeto_core"
    shutil.copytree(
        ROOT / "yeto_core/src/yeto_core", dest, ignore=shutil.ignore_patterns("__pycache__")
    )
    target = dest / module
    target.write_text(target.read_text() + f"\n{bad}  # noqa\n")
    result = _lint(tmp_path)
    assert result.returncode != 0, result.stdout
    assert "the kernel" in result.stdout and "BROKEN" in result.stdout


def test_yeto_core_has_no_import_cycle():
    """No module of yeto_core imports itself back through others (function-level imports too)."""
    import grimp

    graph = grimp.build_graph("yeto_core")
    cycles = []
    for module in sorted(graph.modules):
        for dep in graph.find_modules_directly_imported_by(module):
            if dep != module and graph.chain_exists(importer=dep, imported=module):
                cycles.append((module, dep))
    assert cycles == []
