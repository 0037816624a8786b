"""[sandbox] in the run config, and the sandbox_failures breaker."""

from __future__ import annotations

import math
import time

import pytest

from yeto_core.config.breakers import BreakersConfig
from yeto_core.config.load import parse_config
from yeto_core.errors import ConfigError
from yeto_core.head.breakers import Breakers
from yeto_core.records import Event

BASE = {
    "name": "sbx",
    "run_dir": "runs/sbx",
    "model": {"path": "m"},
    "task": {"name": "sort4"},
    "samplers": [{"name": "sampler", "engine": "hf"}],
    "trainer": {"backend": "torch"},
}


def config(**sandbox):
    return parse_config({**BASE, "sandbox": sandbox})


def test_sandbox_section_defaults_and_values():
    assert parse_config(dict(BASE)).sandbox.host == ""
    s = config(host="bwrap", cpu_s=2, memory_mb=256, wall_s=1.5, options={"max_sandboxes": 4})
    assert (s.sandbox.host, s.sandbox.cpu_s, s.sandbox.memory_mb, s.sandbox.wall_s) == (
        "bwrap",
        2,
        256,
        1.5,
    )
    assert s.sandbox.options == {"max_sandboxes": 4}
    assert s.sandbox.sweep_again_s == 30.0
    assert config(host="bwrap", sweep_again_s=1).sandbox.sweep_again_s == 1.0


@pytest.mark.parametrize(
    "key,value",
    [
        ("cpu_s", math.nan),
        ("cpu_s", 0),
        ("wall_s", math.inf),
        ("wall_s", -1),
        ("wall_s", 1e300),
        ("memory_mb", 2**62),
        ("memory_mb", 8),
        ("sweep_again_s", 0),
        ("sweep_again_s", math.nan),
        ("host", "Not A Host"),
    ],
)
def test_bad_sandbox_values_name_their_path(key, value):
    with pytest.raises(ConfigError, match=rf"sandbox\.{key} = "):
        config(**{"host": "bwrap", key: value})


def test_options_without_a_host_and_unknown_keys_are_refused():
    with pytest.raises(ConfigError, match=r"sandbox\.options is set but sandbox\.host is empty"):
        config(options={"max_sandboxes": 1})
    with pytest.raises(ConfigError, match="wall_seconds"):
        config(host="bwrap", wall_seconds=3)


def trials(ok=0, **failed):
    data = {"ok": ok, "failed": failed, "island": "s-0"}
    if failed:
        data["last_error"] = f"{next(iter(failed))}: detail"
    return Event(kind="sandbox_trials", time=time.time(), source="s-0", data=data)


def test_a_host_that_fails_most_trials_trips_the_breaker():
    b = Breakers(BreakersConfig(sandbox_fail_fraction_max=0.5, sandbox_fail_window=10))
    assert b.observe(trials(ok=4, sandbox_full=1)) is None  # the window is not full yet
    assert b.observe(trials(ok=1, sandbox_host_down=3)) is None  # 4 of 9
    trip = b.observe(trials(sandbox_host_down=3))  # 6 of the last 10
    assert trip is not None and trip.breaker == "sandbox_failures"
    assert trip.inputs["island"] == "s-0" and trip.inputs["failed"] == 6
    assert trip.inputs["trials"] == 10 and trip.inputs["reasons"] == {"sandbox_host_down": 6}
    assert "sandbox_host_down: detail" in trip.message and "[sandbox]" in trip.message


def test_half_failing_or_an_off_breaker_does_not_trip():
    b = Breakers(BreakersConfig(sandbox_fail_fraction_max=0.5, sandbox_fail_window=10))
    for _ in range(5):
        assert b.observe(trials(ok=1, sandbox_timeout=1)) is None
    off = Breakers(BreakersConfig(sandbox_fail_fraction_max=0.0, sandbox_fail_window=2))
    assert off.observe(trials(sandbox_host_down=50)) is None


def test_preflight_names_an_unknown_sandbox_host():
    from yeto_core.config.preflight import Report, check_plugins
    from yeto_core.plugins import Plugins

    report = Report()
    check_plugins(config(host="nosuch"), Plugins(entry_points=False), report)
    [failure] = [c for c in report.failures() if c.name == "sandbox.host"]
    assert "Unknown sandbox host 'nosuch'" in failure.detail and "bwrap" in failure.detail
    report = Report()
    check_plugins(config(host="bwrap"), Plugins(entry_points=False), report)
    assert not [c for c in report.failures() if c.name == "sandbox.host"]


def test_a_host_that_is_down_trips_the_breaker_through_the_islands_events(tmp_path):
    from yeto_core.ports.sandbox import SandboxLimits, labels_of
    from yeto_core.sandbox.bwrap import BwrapSandboxes
    from yeto_core.sandbox.trials import TrialSandboxes

    events = []
    host = BwrapSandboxes(tmp_path, bwrap="/nonexistent/bwrap")
    trials = TrialSandboxes(host, SandboxLimits(), emit=events.append, island="s-0")
    b = Breakers(BreakersConfig(sandbox_fail_window=8))
    for call in range(4):  # four calls of the island, two trials each, none starts
        for n in range(2):
            assert trials.start(labels_of("run", "s-0", 0, "s-0", f"t{call}-{n}"))[0] is None
        trials.flush()
    trip = None
    for event in events:
        trip = b.observe(event) or trip
    assert trip is not None and trip.breaker == "sandbox_failures"
    assert trip.inputs["reasons"] == {"sandbox_host_down": 8}
    assert "/nonexistent/bwrap not found" in trip.message
