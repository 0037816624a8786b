"""examples/vllm/run.toml end to end: two vLLM sampler islands and the torch trainer learn sort4.

Real processes everywhere (the head, two sampler islands each with its own real
vLLM server, trainer incarnations started and stopped by S1). About 10 minutes on
2 cores, so it runs with YETO_SOAK=1 (`make vllm-example`), not in `make test`;
the vLLM engine itself is tested against a real server in tests/vllm/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from yeto_core.testing.streams import stream_events

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "vllm" / "run.toml"
VLLM_VENV = Path(os.environ.get("YETO_VLLM_VENV", ROOT / "build" / "vllm-venv"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"

pytestmark = [
    pytest.mark.soak,
    pytest.mark.skipif(
        os.environ.get("YETO_SOAK") != "1",
        reason="about 10 min on 2 cores: YETO_SOAK=1 (make vllm-example) runs it",
    ),
]


@pytest.mark.timeout(1500)
def test_vllm_example_learns_and_verifies_every_served_policy(tmp_path: Path) -> None:
    if not (VLLM_VENV / ".installed").is_file():
        pytest.skip("the vLLM server environment is not built: run `make vllm-venv`")
    run_dir = tmp_path / "vllm"
    env = dict(os.environ, PYTHONUNBUFFERED="1", YETO_VLLM_PYTHON=str(VLLM_PYTHON))
    proc = subprocess.run(
        [sys.executable, "-c", "from yeto_core.cli import main; main()", "run", "up",
         str(EXAMPLE), "--run-dir", str(run_dir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1400,
    )  # fmt: skip
    print(proc.stdout[-4000:], proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stdout[-4000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["reward_last"] - s["reward_first"] >= 0.3, s
    # the samplers' quiet pauses (pause_until_quiet): each ends once the trainer stood still
    pauses = []
    for island in s["sampler_versions_by_island"]:
        for e in stream_events(run_dir / "store", island):
            if e["kind"] == "sampler_resumed":
                pauses.append((island, e["data"]["paused_s"], e["data"]["ended"]))
    print("pauses (island, s, ended):", pauses)
    assert pauses and any(ended == "quiet" for _, _, ended in pauses), pauses
    assert s["trainer_starts"] >= 2 and s["trainer_stops"] >= 1, s  # S1 stopped and started it
    assert s["groups_trained"] + sum(s["groups_skipped"].values()) == s["groups_appended"], s
    loaded = sum(len(v) for v in s["sampler_versions_by_island"].values())
    assert s["sampler_versions_verified"] == loaded > 0, s
    assert s["sampler_versions_unverified"] == 0 and not s["releases_refused"], s
