"""The TOML run config: structure, unknown keys, bad values, each named by its TOML path."""

from __future__ import annotations

from pathlib import Path

import pytest

from yeto_core.config.load import config_from_dict, config_to_dict, load_config, parse_config
from yeto_core.errors import ConfigError

GOOD = """
name = "demo"
run_dir = "runs/demo"
[model]
path = "runs/base"
[task]
name = "echo"
[[samplers]]
engine = "hf"
count = 2
group_size = 4
min_round_s = 0.5
[samplers.sampling]
max_new_tokens = 3
[[samplers]]
name = "big"
engine = "hf"
price_per_hour = 2.0
[trainer]
backend = "torch"
groups_per_round = 2
price_per_hour = 4.0
[scheduler]
name = "s1"
options = { t_s = 3.0 }
[backstops]
budget_usd = 5.0
wall_clock_s = 300
silence_s = 60
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.toml"
    p.write_text(text)
    return p


def test_a_good_config_structures_into_records(tmp_path: Path) -> None:
    c = load_config(_write(tmp_path, GOOD))
    assert [n for n, _ in c.sampler_islands()] == ["sampler-0", "sampler-1", "big-0"]
    assert c.samplers[0].sampling.max_new_tokens == 3
    assert c.samplers[0].min_round_s == 0.5
    assert c.scheduler.options == {"t_s": 3.0}
    assert c.island_prices() == {"sampler-0": 0.0, "sampler-1": 0.0, "big-0": 2.0, "trainer": 4.0}
    assert c.store_url() == str(Path("runs/demo") / "store")
    assert c.source.endswith("run.toml")
    assert config_from_dict(config_to_dict(c)) == c


def test_run_dir_override(tmp_path: Path) -> None:
    c = load_config(_write(tmp_path, GOOD), run_dir="elsewhere")
    assert c.run_dir == "elsewhere"
    assert c.store_url() == str(Path("elsewhere") / "store")


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            ("[trainer]", "[trainer]\nbatch = 3"),
            "unknown key 'trainer.batch'; allowed keys here: answer_timeout_s, backend,",
        ),
        (
            ("[[samplers]]\nengine", "[[samplers]]\ncolour = 1\nengine"),
            "unknown key 'samplers[0].colour'",
        ),
        (("max_new_tokens = 3", "max_new_tokens = 3\nbeam = 2"), "'samplers[0].sampling.beam'"),
        (
            ('name = "demo"', 'name = "demo"\nextra = 1'),
            "unknown key 'extra'; allowed keys here: backstops,",
        ),
        (
            ("wall_clock_s = 300", "wall_clock_s = 300\nsource = 'x'"),
            "unknown key 'backstops.source'",
        ),
        (("group_size = 4", 'group_size = "four"'), "samplers[0].group_size"),
        (("group_size = 4", "group_size = 1"), "samplers[0].group_size = 1; GRPO needs at least 2"),
        (("count = 2", "count = 0"), "samplers[0].count = 0; it must be > 0"),
        (
            ("count = 2", "count = 2\nwhole_call_wait_s = -1.0"),
            "samplers[0].whole_call_wait_s = -1.0; it must be >= 0",
        ),
        (("budget_usd = 5.0", "budget_usd = -1.0"), "backstops.budget_usd = -1.0; it must be >= 0"),
        (
            ('name = "big"', 'name = "sampler"'),
            "samplers[1].name = 'sampler' is used by samplers[0]",
        ),
        (("groups_per_round = 2", "groups_per_round = 0"), "trainer.groups_per_round = 0"),
        (
            ("groups_per_round = 2", "groups_per_round = 2\npublish_every = 0"),
            "trainer.publish_every = 0; it must be in [1, 1000000]",
        ),
        (
            ("groups_per_round = 2", "groups_per_round = 2\npublish_every = 2.5"),
            "trainer.publish_every",
        ),
        (
            ("max_new_tokens = 3", "max_new_tokens = 3\ntop_p = 1.5"),
            "samplers[0].sampling.top_p = 1.5",
        ),
    ],
)
def test_bad_configs_name_the_toml_path(tmp_path: Path, edit, expected: str) -> None:
    old, new = edit
    assert old in GOOD
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, GOOD.replace(old, new, 1)))
    assert expected in str(info.value)
    assert "run.toml" in str(info.value)


def test_publish_every_is_read_and_refused_with_sync_rounds(tmp_path: Path) -> None:
    every = GOOD.replace("groups_per_round = 2", "groups_per_round = 2\npublish_every = 3")
    assert load_config(_write(tmp_path, every)).trainer.publish_every == 3
    assert load_config(_write(tmp_path, GOOD)).trainer.publish_every == 1
    sync = "min_round_s = 0.5\nsync_rounds = true"
    assert load_config(_write(tmp_path, GOOD.replace("min_round_s = 0.5", sync)))
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, every.replace("min_round_s = 0.5", sync)))
    assert "trainer.publish_every = 3 with sync_rounds on samplers[0]" in str(info.value)
    assert "set trainer.publish_every = 1 or sync_rounds = false" in str(info.value)


def test_missing_sections_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="trainer"):
        parse_config(
            {"run_dir": "r", "model": {"path": "m"}, "task": {"name": "t"}, "samplers": []}
        )
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_write(tmp_path, "[model\n"))
    with pytest.raises(ConfigError, match="cannot read run config"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="run_dir is empty; .*--run-dir"):
        load_config(_write(tmp_path, GOOD.replace('run_dir = "runs/demo"', "")))


def test_the_quickstart_config_loads() -> None:
    root = Path(__file__).resolve().parents[2]
    c = load_config(root / "examples" / "quickstart" / "run.toml")
    assert c.trainer.backend == "torch"
    assert {s.engine for s in c.samplers} == {"hf"}
    assert c.scheduler.name == "s1"
