"""examples/sky/run.toml passes preflight and --dry-run offline (store on a loopback S3)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("yeto_s3")
pytest.importorskip("yeto_core.providers.env", reason="needs the ports API (provider keys)")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sky" / "run.toml"


@pytest.fixture
def example_bucket(monkeypatch):
    from yeto_s3.testing import create_bucket, s3_env, start_moto_server

    endpoint, stop = start_moto_server()
    create_bucket(endpoint, "my-yeto-bucket")
    for k, v in s3_env(endpoint).items():
        monkeypatch.setenv(k, v)
    yield endpoint
    stop()


def _dry_run(config: Path, run_dir: Path):
    from click.testing import CliRunner

    from yeto_core.cli import cli

    return CliRunner().invoke(
        cli, ["run", "up", str(config), "--run-dir", str(run_dir), "--dry-run"]
    )


def test_the_example_passes_preflight_and_dry_run_prints_each_task(example_bucket, tmp_path):
    res = _dry_run(EXAMPLE, tmp_path / "run")
    assert res.exit_code == 0, res.output
    for island in ("sampler-0", "sampler-1", "trainer"):
        assert f"[ok  ] sky.task[{island}]: cluster sky-quickstart-{island}-i0" in res.output
    assert "name: sky-quickstart-sampler-0-i0" in res.output
    assert "use_spot: true" in res.output and "accelerators: L4:1" in res.output
    assert re.search(r"~\$0\.31/h from SkyPilot catalog aws/vms.csv us-east-1", res.output)
    assert "[ok  ] sky.store: s3://my-yeto-bucket/runs/sky-quickstart" in res.output
    assert not (tmp_path / "run" / "sky").exists()  # nothing launched, no journal


def test_an_invalid_resource_in_the_toml_is_refused_with_the_path(example_bucket, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        EXAMPLE.read_text().replace(
            'accelerators = "L4:1", use_spot', 'accelerators = "L4:1", use_spt'
        )
    )
    res = _dry_run(bad, tmp_path / "run")
    assert res.exit_code == 3, res.output
    assert (
        "[FAIL] sky.task[sampler-0]: samplers[0].provider_options.resources: SkyPilot "
        in res.output
    )
    assert "use_spt" in res.output


def test_a_dir_store_is_refused(example_bucket, tmp_path):
    text = EXAMPLE.read_text().replace('store = "s3://my-yeto-bucket/runs/sky-quickstart"', "")
    config = tmp_path / "dir.toml"
    config.write_text(text)
    res = _dry_run(config, tmp_path / "run")
    assert res.exit_code == 3, res.output
    assert "[FAIL] sky.store:" in res.output and "set store to an s3:// URL" in res.output
