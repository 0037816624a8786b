"""``[releases]`` in the run config: parsed, validated, and checked by preflight."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from yeto_core.config.load import parse_config
from yeto_core.config.preflight import run_preflight
from yeto_core.errors import ConfigError
from yeto_core.plugins import Plugins

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "run.toml"


def _config(tmp_path, releases: dict | None):
    data = tomllib.loads(QUICKSTART.read_text())
    if releases is not None:
        data["releases"] = releases
    return parse_config(data, source=str(QUICKSTART), run_dir=str(tmp_path / "run"))


def test_defaults_are_auto_every_8_over_64_mib(tmp_path):
    r = _config(tmp_path, None).releases
    assert (r.deltas, r.full_every, r.delta_min_bytes) == ("auto", 8, 64 * 1024 * 1024)


def test_bad_values_are_named_with_their_path(tmp_path):
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, {"deltas": "sometimes", "full_every": 0})
    assert "releases.deltas = 'sometimes'; allowed values are auto, on, off" in str(err.value)
    assert "releases.full_every = 0; it must be >= 1" in str(err.value)


def test_preflight_warns_when_deltas_are_on_without_a_codec(tmp_path):
    config = _config(tmp_path, {"deltas": "on"})
    bare = run_preflight(config, Plugins(entry_points=False), store=False)
    assert [w for w in bare.warnings() if w.name == "releases.deltas"]
    full = run_preflight(config, Plugins(), store=False)  # yeto-torch provides numpy-zstd
    assert not [w for w in full.warnings() if w.name == "releases.deltas"]
