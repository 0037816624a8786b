"""`yeto run up examples/modal/run.toml --dry-run`: the plan and $/hour, offline.

The only check that needs Modal's service is the store probe (a write to the
Volume); here the Volume seam is the double, so everything else is real: the
config, the core's checks, the Modal objects built for the plan.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from yeto_core.cli import cli
from yeto_modal.prices import hourly_usd
from yeto_modal.volume import ModalVolumeStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "modal" / "run.toml"


def test_example_dry_run_prints_the_plan_and_passes(tmp_path, monkeypatch, volume_double):
    service_cls, seam_cls = volume_double
    service = service_cls("yeto-runs")
    monkeypatch.setattr(ModalVolumeStore, "seam_factory", lambda name, env: seam_cls(service))
    res = CliRunner().invoke(
        cli, ["run", "up", str(EXAMPLE), "--run-dir", str(tmp_path / "run"), "--dry-run"]
    )
    assert res.exit_code == 0, res.output
    out = res.output
    price = round(hourly_usd("L4", 4, 16384), 4)
    assert "[ok  ] store: modal-volume://yeto-runs/modal-quickstart is reachable" in out
    assert "modal-store: modal-volume://yeto-runs/modal-quickstart: one appender" in out
    assert "yeto-sampler (sampler: sampler-0): gpu L4, cpu 4, memory 16384 MiB" in out
    assert "yeto-trainer (trainer: trainer): gpu L4" in out
    wheels = [
        f"/yeto/wheels/{d}-0.1.0-py3-none-any.whl"
        for d in ("yeto_core", "yeto_modal", "yeto_torch")
    ]
    assert f"pip_install {' '.join(wheels)};" in out  # the run's own wheels, no index
    assert "yeto-core==" not in out
    assert (
        f"add_local_file {tmp_path / 'run' / 'wheels' / 'yeto_core-0.1.0-py3-none-any.whl'}" in out
    )
    assert "yeto-core 0.1.0: wheel built at launch from" in out
    assert f"${price:.4f}/hour per island" in out
    assert "FAIL" not in out
    assert not (tmp_path / "run" / "modal").exists()  # nothing was launched
    assert [c[0] for c in service.calls] == ["upload"]  # only the preflight probe


def test_example_dry_run_offline_needs_no_token(tmp_path, monkeypatch):
    """The real SDK and no Modal token: --offline skips the Volume probe, all else runs."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.modal.toml
    for key in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_PROFILE", "MODAL_CONFIG_PATH"):
        monkeypatch.delenv(key, raising=False)
    args = ["run", "up", str(EXAMPLE), "--run-dir", str(tmp_path / "run"), "--dry-run"]
    res = CliRunner().invoke(cli, [*args, "--offline"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "[WARN] store: modal-volume://yeto-runs/modal-quickstart not probed (--offline)" in out
    assert "yeto-sampler (sampler: sampler-0): gpu L4, cpu 4, memory 16384 MiB" in out
    assert f"${round(hourly_usd('L4', 4, 16384), 4):.4f}/hour per island" in out
    assert "the images install the run's own yeto" in out
    assert "pip_install /yeto/wheels/yeto_core-0.1.0-py3-none-any.whl" in out
    assert "FAIL" not in out
    assert not (tmp_path / "run" / "modal").exists()
    assert not (tmp_path / "run" / "wheels").exists()  # built at launch, not by a dry run


def test_offline_without_dry_run_is_refused(tmp_path):
    res = CliRunner().invoke(
        cli, ["run", "up", str(EXAMPLE), "--run-dir", str(tmp_path / "run"), "--offline"]
    )
    assert res.exit_code == 2, res.output
    assert "--offline only goes with --dry-run" in res.output
