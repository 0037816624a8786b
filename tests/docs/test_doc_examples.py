"""Every fenced ```python and ```toml block of the docs and READMEs runs, or says why not.

Where the blocks are: ``docs/*.md`` and every ``README.md`` of the repository (the root,
the distributions under ``plugins/`` and ``yeto_*/``, ``examples/``).

- A ``python`` block runs as a script in a fresh process of this interpreter, in an empty
  temporary directory, within ``PYTHON_TIMEOUT_S``; it passes when it exits 0.
- A ``toml`` block is a run config: it is written to ``run.toml`` in an empty temporary
  directory and goes through ``yeto run up run.toml --dry-run --offline``; it passes when
  that exits 0 (every preflight check ok or a warning).
- ``<!-- doc-example: fragment -->`` just above a ``toml`` block: the block is part of a
  run config; it is merged over ``BASE_CONFIG`` (tables key by key, the block's n-th
  ``[[samplers]]`` entry over the base's) and the result goes through the dry run.
- ``<!-- doc-example: skip: REASON -->`` just above a block: it is not run, for REASON
  (a skip without a reason fails). It is still parsed (``ast.parse`` / ``tomllib``).

A block with no marker that does not run fails, naming its file and line. The markers are
documented in docs/architecture.md ("Examples in the docs run").

The dry runs are batched: one process imports the CLI once and runs every config in turn,
each in its own directory (``yeto run up`` through the same ``yeto_core.cli.main`` the
``yeto`` script calls); the Python blocks each get a process of their own.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Optional

import attrs
import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PYTHON_TIMEOUT_S = 120
DRY_RUN_TIMEOUT_S = 300
LANGS = ("python", "toml")

#: What a ``fragment`` block is merged over: the smallest config the dry run accepts
#: with the distributions of this repository installed (a tiny torch run on this machine).
BASE_CONFIG: dict[str, Any] = {
    "name": "doc-example",
    "run_dir": "run",
    "model": {"path": "base", "base_options": {"task": "sort4"}},
    "task": {"name": "sort4"},
    "samplers": [{"name": "sampler", "engine": "hf", "count": 1}],
    "trainer": {"backend": "torch"},
}

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<lang>[^\s`]*)[^`]*$")
MARKER = re.compile(r"^\s*<!--\s*doc-example:(?P<body>.*?)-->\s*$")


class MarkerError(ValueError):
    """A ``doc-example`` marker the runner does not understand."""


@attrs.frozen
class Block:
    path: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: Optional[str]  # "fragment", "skip", or None
    reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def parse_marker(text: str) -> Optional[tuple[str, str]]:
    """``(kind, reason)`` of a marker line, None for any other line.

    Raises MarkerError for a marker that is not ``fragment`` or ``skip: REASON``.
    """
    m = MARKER.match(text)
    if m is None:
        return None
    body = m.group("body").strip()
    if body == "fragment":
        return ("fragment", "")
    kind, sep, reason = body.partition(":")
    if kind.strip() == "skip":
        if not sep or not reason.strip():
            raise MarkerError(
                f"{text.strip()!r}: a skip needs a reason: <!-- doc-example: skip: REASON -->"
            )
        return ("skip", reason.strip())
    raise MarkerError(
        f"{text.strip()!r}: unknown doc-example marker; use "
        "<!-- doc-example: fragment --> or <!-- doc-example: skip: REASON -->"
    )


def find_blocks(text: str, path: str) -> list[Block]:
    """The ``python`` and ``toml`` blocks of one Markdown file, with their markers.

    A marker belongs to the block right below it (blank lines between are allowed); a
    marker with no such block below it is a MarkerError.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    pending: Optional[tuple[int, str, str]] = None  # (line, kind, reason)
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            try:
                marker = parse_marker(lines[i])
            except MarkerError as exc:
                raise MarkerError(f"{path}:{i + 1}: {exc}") from None
            if marker is not None:
                if pending is not None:
                    raise MarkerError(f"{path}:{pending[0]}: marker has no code block below it")
                pending = (i + 1, *marker)
            elif lines[i].strip() and pending is not None:
                raise MarkerError(f"{path}:{pending[0]}: marker has no code block right below it")
            i += 1
            continue
        indent, ticks, lang = fence.group("indent"), fence.group("ticks"), fence.group("lang")
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not re.match(rf"^[ \t]*{ticks}`*\s*$", lines[i]):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1  # the closing fence
        lang = lang.lower()
        if lang in LANGS:
            kind, reason = (pending[1], pending[2]) if pending else (None, "")
            if kind == "fragment" and lang != "toml":
                raise MarkerError(f"{path}:{pending[0]}: only a toml block can be a fragment")
            code = textwrap.dedent("\n".join(body)) + "\n"
            blocks.append(Block(path, start + 1, lang, code, kind, reason))
        elif pending is not None:
            raise MarkerError(f"{path}:{pending[0]}: marker above a {lang or 'plain'} block")
        pending = None
    if pending is not None:
        raise MarkerError(f"{path}:{pending[0]}: marker has no code block below it")
    return blocks


SKIP_DIRS = {"build", "node_modules", "runs", "__pycache__"}


def doc_files(root: Path = ROOT) -> list[Path]:
    """docs/*.md and every README.md of the repository (not in virtualenvs, builds, runs)."""
    files = set(root.glob("docs/*.md"))
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
        if "README.md" in filenames:
            files.add(Path(dirpath) / "README.md")
    return sorted(files)


def all_blocks() -> tuple[list[Block], list[str]]:
    """Every block of every file, and the marker errors of the files that have one."""
    out: list[Block] = []
    errors: list[str] = []
    for f in doc_files():
        try:
            out += find_blocks(f.read_text(encoding="utf-8"), f.relative_to(ROOT).as_posix())
        except MarkerError as exc:
            errors.append(str(exc))
    return out, errors


def merge(base: Any, over: Any) -> Any:
    """``over`` on top of ``base``: tables key by key, ``[[samplers]]`` entry by entry."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(base[k], v) if k in base else v
        return out
    if isinstance(base, list) and isinstance(over, list) and all(isinstance(x, dict) for x in over):
        return [merge(base[n], v) if n < len(base) else v for n, v in enumerate(over)]
    return over


def dumps_toml(data: dict[str, Any]) -> str:
    """TOML for the merged config (only the value types a run config uses)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + " }"
        raise TypeError(f"no TOML for {v!r}")

    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for k, v in data.items():
        if isinstance(v, dict) or (isinstance(v, list) and v and isinstance(v[0], dict)):
            tables.append((k, v))
        else:
            lines.append(f"{json.dumps(k)} = {value(v)}")
    for k, v in tables:
        for entry in v if isinstance(v, list) else [v]:
            lines.append(f"[[{k}]]" if isinstance(v, list) else f"[{k}]")
            lines += [f"{json.dumps(kk)} = {value(vv)}" for kk, vv in entry.items()]
    return "\n".join(lines) + "\n"


def config_text(block: Block) -> str:
    if block.marker == "fragment":
        return dumps_toml(merge(BASE_CONFIG, tomllib.loads(block.code)))
    return block.code


BLOCKS, MARKER_ERRORS = all_blocks()
RUNNABLE_TOML = [b for b in BLOCKS if b.lang == "toml" and b.marker != "skip"]

# One process for every dry run: `yeto run up FILE --dry-run --offline` per directory.
DRY_RUN_DRIVER = r"""
import contextlib, io, json, os, sys
from yeto_core.cli import main
out = {}
for key, directory in json.loads(sys.argv[1]):
    os.chdir(directory)
    buf = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            main(["run", "up", "run.toml", "--dry-run", "--offline"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:
            buf.write(f"{type(exc).__name__}: {exc}")
            code = 1
    out[key] = [code, buf.getvalue()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    jobs = []
    for n, block in enumerate(RUNNABLE_TOML):
        d = tmp_path_factory.mktemp(f"toml{n}")
        (d / "run.toml").write_text(config_text(block), encoding="utf-8")
        jobs.append((block.id, str(d)))
    if not jobs:
        return {}
    proc = subprocess.run(
        [sys.executable, "-c", DRY_RUN_DRIVER, json.dumps(jobs)],
        capture_output=True,
        text=True,
        timeout=DRY_RUN_TIMEOUT_S,
        cwd=jobs[0][1],
    )
    assert proc.returncode == 0, f"the dry-run driver failed:\n{proc.stderr[-4000:]}"
    return {k: (c, o) for k, (c, o) in json.loads(proc.stdout.splitlines()[-1]).items()}


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_example(block: Block, dry_runs: dict[str, tuple[int, str]], tmp_path: Path) -> None:
    where = f"{block.id} ({block.lang} block)"
    # every block parses, run or not
    if block.lang == "python":
        try:
            ast.parse(block.code, filename=block.id)
        except SyntaxError as exc:
            pytest.fail(f"{where} is not valid Python: {exc}")
    else:
        try:
            tomllib.loads(block.code)
        except tomllib.TOMLDecodeError as exc:
            pytest.fail(f"{where} is not valid TOML: {exc}")
    if block.marker == "skip":
        return
    hint = "fix the example, or mark it with <!-- doc-example: skip: REASON --> right above it" + (
        " (or <!-- doc-example: fragment --> for part of a run config)"
        if block.lang == "toml"
        else ""
    )
    if block.lang == "python":
        script = tmp_path / "example.py"
        script.write_text(block.code, encoding="utf-8")
        try:
            proc = subprocess.run(
                [sys.executable, str(script)],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=PYTHON_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{where} ran longer than {PYTHON_TIMEOUT_S} s; {hint}")
        assert proc.returncode == 0, (
            f"{where} exited {proc.returncode}; {hint}\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    else:
        code, output = dry_runs[block.id]
        failed = [ln for ln in output.splitlines() if "[FAIL]" in ln or "error" in ln]
        assert code == 0, (
            f"{where}: `yeto run up --dry-run --offline` exited {code}; {hint}\n"
            + "".join(f"  {ln.strip()}\n" for ln in failed)
            + f"config:\n{config_text(block)}\noutput:\n{output[-3000:]}"
        )


def test_every_doc_example_marker_is_well_formed() -> None:
    assert not MARKER_ERRORS, "\n".join(MARKER_ERRORS)


# -- the runner's own rules ------------------------------------------------------------


def test_the_runner_finds_the_blocks_of_the_docs_and_readmes() -> None:
    files = {b.path for b in BLOCKS}
    assert "docs/plugins.md" in files and "plugins/yeto-s3/README.md" in files
    assert {b.lang for b in BLOCKS} == {"python", "toml"}


def test_a_marker_applies_to_the_block_right_below_it() -> None:
    text = (
        "x\n\n<!-- doc-example: skip: needs a Modal account -->\n\n```python\nimport modal\n```\n"
        "<!-- doc-example: fragment -->\n```toml\n[trainer]\nbackend = 'torch'\n```\n"
        "```toml\nname = 'x'\n```\n"
        "```\nnot python\n```\n"
    )
    a, b, c = find_blocks(text, "d.md")
    assert (a.line, a.lang, a.marker, a.reason) == (5, "python", "skip", "needs a Modal account")
    assert (b.line, b.marker, b.code) == (9, "fragment", "[trainer]\nbackend = 'torch'\n")
    assert (c.line, c.marker) == (13, None)


@pytest.mark.parametrize(
    "text, message",
    [
        ("<!-- doc-example: skip -->\n```python\npass\n```\n", "needs a reason"),
        ("<!-- doc-example: skip:   -->\n```python\npass\n```\n", "needs a reason"),
        ("<!-- doc-example: later -->\n```python\npass\n```\n", "unknown doc-example marker"),
        ("<!-- doc-example: fragment -->\n```python\npass\n```\n", "only a toml block"),
        ("<!-- doc-example: skip: why -->\nprose\n```python\npass\n```\n", "right below"),
        ("<!-- doc-example: skip: why -->\n```\nshell\n```\n", "marker above a plain block"),
        ("text\n<!-- doc-example: skip: why -->\n", "no code block below"),
    ],
)
def test_a_marker_the_runner_cannot_apply_fails(text: str, message: str) -> None:
    with pytest.raises(MarkerError, match=message):
        find_blocks(text, "d.md")


def test_a_fragment_is_merged_over_the_base_config() -> None:
    block = Block(
        "d.md",
        1,
        "toml",
        '[[samplers]]\nengine = "vllm"\n[trainer]\ngroups_per_round = 4\n',
        "fragment",
    )
    merged = tomllib.loads(config_text(block))
    assert merged["samplers"] == [{"name": "sampler", "engine": "vllm", "count": 1}]
    assert merged["trainer"] == {"backend": "torch", "groups_per_round": 4}
    assert merged["model"] == BASE_CONFIG["model"]
