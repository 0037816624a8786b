"""The head's run dir: its local view of a run (no island ever reads it).

Files (``run_dir`` in the config, or ``--run-dir``)::

    config.json      the resolved config (a copy of the store's run/config.json)
    head.json        the live head's pid (one head per run dir)
    status.json      progress, rewritten every tick (``yeto run status``)
    DOWN             a stop request (``yeto run down``)
    cost.jsonl       a copy of the store's resource ledger (``yeto cost``)
    summary.json     the run's figures, written when the head stops
    FINISHED         the run finished; ``yeto run up`` does not start it again

Every command that names a run takes the same ``RUN``: the run dir, or the
TOML config whose ``run_dir`` it is (:func:`resolve_run`).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Optional

from yeto_core.config.load import RunConfig, config_from_dict, load_config
from yeto_core.errors import ConfigError

# -- exit codes (docs/run-config.md#exit-codes) ---------------------------------------
EXIT_OK = 0  # finished (total_rounds trained, data ended) or stopped by `yeto run down`
EXIT_FAILED = 1  # an island kept failing, a release could not be verified, an error
EXIT_CONFIG = 2  # the config or a plugin is wrong (nothing started)
EXIT_PREFLIGHT = 3  # a preflight check failed (nothing started)
EXIT_BUDGET = 4  # the cost guard stopped the run at its budget (docs/cost.md)
EXIT_WALL_CLOCK = 5  # backstop: the wall-clock limit was reached
EXIT_SILENCE = 6  # backstop: no new group for silence_s
EXIT_BUSY = 7  # another head is running on this run dir
EXIT_GAVE_UP = 8  # the trainer loop gave up: max_failures incarnations in a row trained nothing
EXIT_FENCED = 9  # another head took this run's lease (this one was paused); nothing written
EXIT_BREAKER = 10  # a run health breaker tripped (docs/run-config.md#breakers)
EXIT_INTERRUPTED = 130  # Ctrl-C (the run was still stopped cleanly)

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "finished, or stopped by yeto run down",
    EXIT_FAILED: "failed (see the head's message and logs/)",
    EXIT_CONFIG: "config or plugin error; nothing started",
    EXIT_PREFLIGHT: "a preflight check failed; nothing started",
    EXIT_BUDGET: "stopped by the cost guard at the budget",
    EXIT_WALL_CLOCK: "stopped by the wall-clock backstop",
    EXIT_SILENCE: "stopped by the silence backstop",
    EXIT_BUSY: "another head runs on this run dir",
    EXIT_GAVE_UP: "the trainer loop gave up: max_failures incarnations in a row trained "
    "nothing (see head/journal); the run stays resumable",
    EXIT_FENCED: "fenced: another head took the run's lease; this one stopped without writing",
    EXIT_BREAKER: "stopped by a run health breaker",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C); stopped cleanly",
}

BACKSTOP_EXIT = {
    "budget": EXIT_BUDGET,
    "wall_clock": EXIT_WALL_CLOCK,
    "silence": EXIT_SILENCE,
    "breaker": EXIT_BREAKER,
}

CONFIG_FILE = "config.json"
HEAD_FILE = "head.json"
STATUS_FILE = "status.json"
DOWN_FILE = "DOWN"
SUMMARY_FILE = "summary.json"
FINISHED_FILE = "FINISHED"


def json_safe(data: Any) -> Any:
    """``data`` with every non-finite float (NaN, inf) as None: strict JSON has none."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v) for v in data]
    return data


def write_json_atomic(path: Path, data: Any, *, durable: bool = True) -> None:
    """Write ``data`` as strict JSON (non-finite numbers become null), durably.

    The file is written under a temporary name, fsynced, renamed into place,
    and the directory fsynced, so a crash leaves the old file or the new one.
    ``durable=False`` skips both fsyncs (still a whole old or new file after a process
    crash): for a view rewritten every tick, such as ``status.json``.
    """
    text = json.dumps(json_safe(data), indent=2, sort_keys=True, default=str, allow_nan=False)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text + "\n")
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if not durable:
        return
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return True


def live_head(run_dir: Path) -> Optional[dict[str, Any]]:
    """The head running on ``run_dir`` (pid alive), or None."""
    info = read_json(run_dir / HEAD_FILE)
    if info and _pid_alive(int(info.get("pid", -1))):
        return info
    return None


def request_down(run_dir: Path, reason: str = "yeto run down") -> None:
    """Ask the head of ``run_dir`` to stop cleanly (it polls for the file)."""
    write_json_atomic(run_dir / DOWN_FILE, {"time": time.time(), "reason": reason})


def load_run_config(run_dir: str | os.PathLike[str]) -> RunConfig:
    """The resolved config the head wrote into the run dir."""
    path = Path(run_dir) / CONFIG_FILE
    try:
        data = json.loads(path.read_text())
    except OSError:
        raise ConfigError(
            f"{run_dir} holds no {CONFIG_FILE}: is it a run dir? `yeto run up CONFIG` makes one"
        ) from None
    return config_from_dict(data)


def resolve_run(run: str | os.PathLike[str]) -> tuple[Path, RunConfig]:
    """``RUN`` of every command: a run dir, or a TOML config (its ``run_dir``).

    A run dir is read from its ``config.json`` (written by the head, absolute
    paths), or from the ``run.toml`` it holds before a head ran there.

    :returns: the run dir and the config.
    :raises ConfigError: when ``run`` is neither.
    """
    path = Path(run)
    if path.is_dir():
        if (path / CONFIG_FILE).is_file():
            return path, load_run_config(path)
        if (path / "run.toml").is_file():
            return path, load_config(path / "run.toml", run_dir=str(path))
        raise ConfigError(
            f"{str(path)!r} is a directory without {CONFIG_FILE} or run.toml: not a run dir. "
            "RUN is a run dir or a run config (TOML)"
        )
    if path.is_file():
        config = load_config(path)
        run_dir = Path(config.run_dir)
        if (run_dir / CONFIG_FILE).is_file():
            return run_dir, load_run_config(run_dir)
        return run_dir, config
    raise ConfigError(f"{str(path)!r} is neither a run dir nor a run config (TOML) file")


def resolve_store_url(ref: str) -> str:
    """A store URL, or the store of ``RUN`` (a run dir or a run config)."""
    path = Path(ref)
    if "://" in ref or (path.is_dir() and not _looks_like_run_dir(path)):
        return ref
    return resolve_run(ref)[1].store_url()


def _looks_like_run_dir(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file() or (path / "run.toml").is_file()
