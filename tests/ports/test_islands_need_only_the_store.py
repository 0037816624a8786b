"""Islands need only the store: a cut-down quickstart through a third-party provider on S3.

The head (the `yeto` CLI) runs the quickstart's parts (two `hf` sampler islands,
the `torch` trainer island, S1) with `store = "s3://..."` on the loopback S3 server
and every island on the `tempdir` provider of `examples/third_party_plugin`: each
island is a process group in a fresh empty directory whose environment is only
`PATH` plus the launch record's env. The islands read the config, the base model
and the releases from S3; the test checks, while the run goes, that no island's
environment names the run dir and that no island's directory holds a run dir.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("yeto_torch")
pytest.importorskip("yeto_example_memory")

from yeto_s3.store import S3Store
from yeto_s3.testing import create_bucket, s3_env, s3_options, start_moto_server

ROOT = Path(__file__).resolve().parents[2]
YETO = [sys.executable, "-c", "from yeto_core.cli import main; main()"]
BASE = ROOT / "runs" / "base" / "sort4-t30"  # the quickstart's base (built once, reused)
ALLOWED_ENV = {
    "PATH",
    "YETO_STORE",
    "YETO_RUN_ID",
    "YETO_ROLE",
    "YETO_ISLAND",
    "YETO_INCARNATION",
    "YETO_TRAINER_CUT",
    "YETO_START_SUBMITTED_UNIX",  # a provider's submission time (T_s from submission)
    "YETO_STORE_S3_ACCESS_KEY_ID",
    "YETO_STORE_S3_SECRET_ACCESS_KEY",
    "YETO_STORE_S3_SESSION_TOKEN",
    "YETO_STORE_S3_ENDPOINT_URL",
    "YETO_STORE_S3_REGION",
    # set by the Python runtime itself in every process it starts
    "LC_CTYPE",
}
RUN_DIR_FILES = {"config.json", "status.json", "summary.json", "cost.jsonl", "head.json", "store"}

pytestmark = pytest.mark.slow


def _config(run_dir: Path, store_url: str, islands_root: Path, total_rounds: int) -> str:
    tempdir = (
        f'provider = "tempdir"\nprovider_options = {{ root = "{islands_root}", keep_dirs = true }}'
    )
    return f"""
name = "store-only"
run_dir = "{run_dir}"
store = "{store_url}"
seed = 0

[model]
path = "{BASE}"
base_options = {{ task = "sort4", target_reward = 0.3 }}

[task]
name = "sort4"

[[samplers]]
name = "sampler"
engine = "hf"
count = 2
group_size = 8
prompts_per_call = 4
min_round_s = 0.3
backlog_cap = 32
engine_options = {{ threads = 1 }}
{tempdir}
[samplers.sampling]
max_new_tokens = 6

[trainer]
backend = "torch"
backend_options = {{ lr = 0.0002, threads = 1 }}
groups_per_round = 8
max_policy_age = 3
total_rounds = {total_rounds}
{tempdir}

[scheduler]
name = "s1"
tick_s = 0.1
options = {{ start_seconds_fixed = 3.0 }}

[backstops]
wall_clock_s = 600
silence_s = 180
"""


class IslandWatcher:
    """Samples every process whose working directory is under ``root`` (the islands)."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.seen: dict[int, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _scan(self) -> None:
        # Every scan reads every island process again and keeps its latest view: a child
        # caught between its fork (already in the island's directory) and its exec still
        # shows its launcher's environment, which the exec replaces.
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cwd = os.readlink(entry / "cwd")
                if not cwd.startswith(self.root):
                    continue
                raw = (entry / "environ").read_bytes()
            except OSError:
                continue
            env = dict(kv.split("=", 1) for kv in raw.decode().split("\0") if "=" in kv)
            self.seen[int(entry.name)] = {"cwd": cwd, "env": env}

    def _run(self) -> None:
        while not self._stop.is_set():
            self._scan()
            self._stop.wait(0.2)

    def __enter__(self) -> IslandWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def _assert_islands_saw_only_the_store(
    watcher: IslandWatcher, islands_root: Path, run_dir: Path, store_url: str
) -> None:
    """Every island ran with nothing but the store URL, the ids and the credentials in its
    environment, outside the run dir, and no island directory holds a run dir."""
    roles = {p["env"].get("YETO_ROLE") for p in watcher.seen.values()}
    assert roles == {"sampler", "trainer"}, watcher.seen
    for info in watcher.seen.values():
        extra = set(info["env"]) - ALLOWED_ENV
        assert not extra, (extra, info["cwd"])
        assert info["env"]["YETO_STORE"] == store_url
        assert not any(str(run_dir) in v for v in info["env"].values()), info["env"]
        assert not info["cwd"].startswith(str(run_dir))
    dirs = list(islands_root.iterdir()) if islands_root.exists() else []
    assert dirs, f"no island directory under {islands_root}"
    for d in dirs:
        names = {p.name for p in d.rglob("*")}
        assert not names & RUN_DIR_FILES - {"config.json"}, (d, names & RUN_DIR_FILES)
        assert not (d / "config.json").exists(), d  # the model's config.json is in .yeto-model/


@pytest.mark.timeout(1500)
def test_the_quickstart_runs_on_s3_through_a_third_party_provider(tmp_path: Path) -> None:
    endpoint, stop_server = start_moto_server()
    try:
        create_bucket(endpoint, "yeto-qs")
        store_url = "s3://yeto-qs/runs/store-only"
        run_dir, islands_root = tmp_path / "run", tmp_path / "islands"
        toml = tmp_path / "run.toml"
        toml.write_text(_config(run_dir, store_url, islands_root, total_rounds=4))
        env = dict(os.environ, PYTHONUNBUFFERED="1", **s3_env(endpoint))
        with IslandWatcher(islands_root) as watcher:
            proc = subprocess.run(
                [*YETO, "run", "up", str(toml)],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=1200,
            )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]

        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["trainer_starts"] >= 1, summary
        assert summary["releases_published"] >= 4, summary
        trained = summary["groups_trained"] + sum(summary["groups_skipped"].values())
        assert trained == summary["groups_appended"], summary

        _assert_islands_saw_only_the_store(watcher, islands_root, run_dir, store_url)
        # What the islands read is in S3.
        s3 = S3Store.from_url(store_url, **s3_options(endpoint))
        assert s3.exists("run/config.json") and s3.exists("run/model/manifest.json")
        assert s3.exists("releases/LATEST.json")
        assert {"sampler-0", "sampler-1", "trainer"} <= {
            k.split("/", 1)[1].removesuffix(".jsonl") for k in s3.list("events/")
        }
    finally:
        stop_server()


def test_the_example_run_config_selects_the_tempdir_provider() -> None:
    from yeto_core.config.load import load_config

    config = load_config(ROOT / "examples" / "third_party_plugin" / "run.toml")
    assert {s.provider for s in config.samplers} == {"tempdir"}
    assert config.trainer.provider == "tempdir"


@pytest.mark.soak
@pytest.mark.skipif(
    os.environ.get("YETO_SOAK") != "1",
    reason="the full 600-round quickstart, 5-15 min on 2 cores: YETO_SOAK=1 (make examples)",
)
@pytest.mark.timeout(3000)
def test_the_full_quickstart_learns_through_the_tempdir_provider(tmp_path: Path) -> None:
    """`examples/third_party_plugin/run.toml` as it ships (the quickstart, 600 rounds, with its
    samplers and trainer on `tempdir`), with only the wall-clock backstop raised for a
    loaded machine, the run dir and the store (a dir store beside the run dir, so an island
    environment naming the run dir would show) under ``tmp_path`` and the island directories
    kept there to inspect."""
    text = (ROOT / "examples" / "third_party_plugin" / "run.toml").read_text()
    assert text.count('provider = "tempdir"\n') == 2 and "wall_clock_s = 300" in text
    islands_root, run_dir, store = tmp_path / "islands", tmp_path / "run", tmp_path / "store"
    assert 'run_dir = "runs/quickstart-tempdir"\n' in text
    text = text.replace(
        'run_dir = "runs/quickstart-tempdir"\n',
        f'run_dir = "{run_dir}"\nstore = "{store}"  # outside the run dir: the env check means it\n',
    )
    text = text.replace(
        'provider = "tempdir"\n',
        f'provider = "tempdir"\nprovider_options = {{ root = "{islands_root}", keep_dirs = true }}\n',
    ).replace("wall_clock_s = 300", "wall_clock_s = 2400")
    toml = tmp_path / "run.toml"
    toml.write_text(text)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with IslandWatcher(islands_root) as watcher:
        proc = subprocess.run(
            [*YETO, "run", "up", str(toml)],
            cwd=ROOT,  # model.path is relative to the checkout: the quickstart's base
            env=env,
            capture_output=True,
            text=True,
            timeout=2900,
        )
    out = proc.stdout + proc.stderr
    print(out[-3000:])
    assert proc.returncode == 0, out[-4000:]
    s = json.loads((run_dir / "summary.json").read_text())
    print(json.dumps(s, indent=1, sort_keys=True))
    # the quickstart's acceptance figures (tests/integration/test_quickstart.py)
    assert s["reward_last"] >= 0.8, s
    assert s["reward_last"] - s["reward_first"] >= 0.3, s
    assert s["trainer_starts"] >= 2, s
    assert s["groups_trained"] + sum(s["groups_skipped"].values()) == s["groups_appended"], s
    assert not list((run_dir / "islands").glob("*.json"))  # every island released
    _assert_islands_saw_only_the_store(watcher, islands_root, run_dir, str(store))
