"""The quickstart with delta releases forced on (``[releases] deltas = "on"``).

The quickstart's model is 0.5 MB, under ``delta_min_bytes``, so its releases are full
by default; this run forces deltas (a full release every 4) and checks that it still
learns and accounts for every group as the quickstart test does, that the trainer
published deltas and that the samplers loaded them (verified) without a refusal.
About 10 minutes on 2 cores: run with YETO_SOAK=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("yeto_torch")

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart" / "run.toml"
YETO = [sys.executable, "-c", "from yeto_core.cli import main; main()"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("YETO_SOAK") != "1",
        reason="a whole quickstart run (~10 min on 2 cores): YETO_SOAK=1 runs it",
    ),
]


def _events(run_dir: Path) -> dict[str, list[dict]]:
    out = {}
    for p in (run_dir / "store" / "events").glob("*.jsonl"):
        out[p.stem] = [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]
    return out


@pytest.mark.timeout(2700)
def test_quickstart_learns_with_delta_releases_forced_on(tmp_path: Path) -> None:
    run_dir = tmp_path / "qs-deltas"
    text = QUICKSTART.read_text().replace("wall_clock_s = 300", "wall_clock_s = 2400")
    config = tmp_path / "quickstart-deltas.toml"
    config.write_text(text + '\n[releases]\ndeltas = "on"\nfull_every = 4\n')
    proc = subprocess.run(
        [*YETO, "run", "up", str(config), "--run-dir", str(run_dir)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        capture_output=True,
        text=True,
        timeout=2600,
    )
    out = proc.stdout + proc.stderr
    print(out[-3000:])
    assert proc.returncode == 0, out[-4000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["reward_last"] >= 0.8, s
    assert s["reward_last"] - s["reward_first"] >= 0.3, s
    assert s["trainer_starts"] >= 2, s
    assert s["groups_trained"] + sum(s["groups_skipped"].values()) == s["groups_appended"], s
    ev = _events(run_dir)
    # publications (a new incarnation first republishes its cut's release: nothing stored)
    published = [
        e["data"]
        for e in ev["trainer"]
        if e["kind"] == "release_published" and not e["data"].get("republished")
    ]
    encodings = [p.get("encoding") for p in published]
    assert encodings.count("delta") >= 3, encodings
    assert all(p["stored_bytes"] < p["full_bytes"] for p in published if p["encoding"] == "delta")
    for island in ("sampler-0", "sampler-1"):
        loaded = [e["data"] for e in ev[island] if e["kind"] == "release_loaded"]
        assert sum(1 for d in loaded if d.get("encoding") == "delta") >= 3, island
        assert all(d["verified"] for d in loaded), island
        assert not [e for e in ev[island] if e["kind"] == "release_refused"], island
