"""Two heads on one run, with real processes: a second head on a live run is refused; a head
paused (SIGSTOP) past its lease is taken over, and when it wakes it exits 9 writing nothing."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import attrs

from yeto_core.head.lease import read_lease
from yeto_core.head.run import EXIT_BUSY, EXIT_FENCED, EXIT_OK
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_run import fake_head, fake_run_config
from yeto_core.testing.streams import stream_events

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from yeto_core.config.load import config_from_dict
    from yeto_core.testing.fake_run import fake_head
    config = config_from_dict(json.loads(open({cfg!r}).read()))
    sys.exit(fake_head(config).run(lambda m: print(m, flush=True)))
    """
)


def _config(tmp_path: Path, lease_s: float = 30.0):
    config = fake_run_config(tmp_path, total_rounds=0, wall_clock_s=240.0)
    return attrs.evolve(config, scheduler=attrs.evolve(config.scheduler, head_lease_s=lease_s))


def _start(config, tmp_path: Path, name: str) -> subprocess.Popen:
    from yeto_core.config.load import config_to_dict

    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps(config_to_dict(config)))
    return subprocess.Popen(
        [sys.executable, "-c", _SCRIPT.format(cfg=str(cfg))],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait(pred, what: str, deadline_s: float = 90.0) -> None:
    end = time.monotonic() + deadline_s
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def _rounds(config) -> int:
    try:
        st = json.loads((Path(config.run_dir) / "status.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(st.get("trained_rounds") or 0)


def _store(config) -> DirStore:
    return DirStore(Path(config.run_dir) / "store")


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _down(config) -> None:
    from click.testing import CliRunner

    from yeto_core.cli import cli

    res = CliRunner().invoke(cli, ["run", "down", config.run_dir, "--timeout", "90"])
    assert res.exit_code == 0, res.output


def test_a_second_head_on_a_live_run_is_refused_and_the_first_runs_on(tmp_path):
    config = _config(tmp_path)
    first = _start(config, tmp_path, "first")
    try:
        _wait(lambda: _rounds(config) >= 2, "two trained rounds")
        lines: list[str] = []
        assert fake_head(config).run(lines.append) == EXIT_BUSY
        assert any("another head holds this run's lease" in ln for ln in lines), lines
        before = _rounds(config)
        _wait(lambda: _rounds(config) > before + 1, "the first head training on")
        assert first.poll() is None
        _down(config)
        assert first.wait(timeout=90) == EXIT_OK
    finally:
        if first.poll() is None:
            first.kill()
    assert read_lease(_store(config))["expires_at"] == 0.0  # released by the clean stop


def test_a_paused_head_is_fenced_by_the_next_one_and_exits_without_writing(tmp_path):
    config = _config(tmp_path, lease_s=3.0)
    first = _start(config, tmp_path, "first")
    second = None
    try:
        _wait(lambda: _rounds(config) >= 2, "two trained rounds")
        holder = read_lease(_store(config))["holder"]
        first.send_signal(signal.SIGSTOP)
        _wait(lambda: read_lease(_store(config))["expires_at"] < time.time(), "the lease to lapse")
        second = _start(config, tmp_path, "second")
        _wait(
            lambda: read_lease(_store(config))["holder"] != holder and _rounds(config) >= 1,
            "the second head to take the lease",
        )
        at_takeover = _rounds(config)
        _wait(lambda: _rounds(config) >= at_takeover + 2, "the second head training")
        _down(config)
        assert second.wait(timeout=90) == EXIT_OK
        # the run is quiet now: whatever changes in the store from here is the first head's
        root = Path(config.run_dir) / "store"
        before = _snapshot(root)
        first.send_signal(signal.SIGCONT)
        assert first.wait(timeout=60) == EXIT_FENCED
        out = first.stdout.read()
        assert "lost the run's lease" in out, out
        after = _snapshot(root)
        # Known gap (docs/reliability.md): a put the first head had begun when it was
        # stopped (its temporary file written, not yet renamed) completes on SIGCONT,
        # before the head sees it is fenced. Only such a completion may differ. A
        # create-only put (a journal entry) whose key the second head wrote since loses:
        # its temporary file goes and the second head's object stays as it was.
        finished = {k: v for k, v in before.items() if ".tmp-" in k and k not in after}
        for tmp, digest in finished.items():
            parent, name = tmp.rsplit("/", 1) if "/" in tmp else ("", tmp)
            final = name[1:].split(".tmp-")[0]
            key = f"{parent}/{final}" if parent else final
            landed = after.pop(key, None)
            assert landed in (digest, before.pop(key, None)), (tmp, key)
            before.pop(tmp)
        assert after == before
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
    head_events = stream_events(root, "head")
    taken = [e for e in head_events if e["kind"] == "head_lease_taken_over"]
    assert len(taken) == 1 and taken[0]["data"]["lapsed"]["holder"] == holder
