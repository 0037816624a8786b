"""The run config: one TOML file structured into attrs records.

Every key is checked before anything starts: an unknown key names its TOML
path and the keys allowed there; a bad value names its path and the allowed
values. See ``docs/run-config.md`` for every field.

Layout (all tables optional except ``model``, ``task``, ``samplers`` and ``trainer``)::

    name = "quickstart"
    run_dir = "runs/quickstart"        # the head's local state; --run-dir overrides
    store = ""                         # store URL; empty: <run_dir>/store (the dir store)
    seed = 0

    [model]
    path = "runs/base/tiny"            # a model dir (its config.json must exist) ...
    base_options = {}                  # ... unless this asks the backend to build one there

    [task]
    name = "..."
    options = {}

    [[samplers]]                       # one table per sampler island group
    name = "sampler"
    engine = "hf"
    count = 1                          # islands in this group (sampler-0, sampler-1, ...)
    group_size = 8                     # G: samples per prompt
    prompts_per_call = 1
    min_round_s = 0.0                  # throttle: at least this long per generate call
    pause_every_s = 0.0                # throttle: after this long sampling ...
    pause_s = 0.0                      # ... sample nothing for this long (0: never)
    backlog_cap = 64                   # wait while this many groups wait for the trainer
    sync_rounds = false                # synchronous GRPO: before call n+1, wait for policy version >= n
    price_per_hour = 0.0
    engine_options = {}
    provider = "local"                 # the island provider that runs these islands
    provider_options = {}              # passed to the provider with each launch
    node_class = "fixed"               # or "convertible": [conversion] may make it the trainer
    spot = false                       # spot nodes never convert
    precision = ""                     # a convertible group's must equal trainer.precision
    [samplers.sampling]
    max_new_tokens = 8
    temperature = 1.0

    [trainer]
    backend = "torch"
    backend_options = {}
    groups_per_round = 4
    max_policy_age = 2
    total_rounds = 0                   # rounds before the run finishes; 0: no limit
    price_per_hour = 0.0
    lifecycle = "remote"               # "remote": the trainer is an island; "driver": in the head
    provider = "local"                 # the island provider of the trainer island
    provider_options = {}

    [buffer]
    kind = "file"                      # the sample buffer implementation
    layout = "auto"                    # file buffer: auto, jsonl, objects, shards
    options = {}

    [conversion]
    name = "none"                      # the conversion port: "none" or "local" (docs/conversion.md)
    options = {}

    [scheduler]
    name = "s1"                        # or "always-on"
    options = {}
    tick_s = 0.5

    [backstops]
    budget_usd = 0.0                   # 0: no budget limit (then prices must be 0 too)
    wall_clock_s = 0.0                 # 0: no limit
    silence_s = 0.0                    # 0: no limit; else stop when no group arrives for this long

    [cost]                             # the cost guard (docs/cost.md); budget: backstops.budget_usd
    prices = "provider"                # "provider": what the provider reports, else price_per_hour; "config": always price_per_hour
    soft_fraction = 0.8                # projected spend >= this share of the budget: scale down first
    min_samplers = 1                   # the soft stage releases samplers down to this many
    sampler_release_s = 10.0           # floors of what a sampler's release, a trainer's drain,
    trainer_stop_s = 60.0              # cut and release, and the head's reaction take (the
    react_s = 5.0                      # guard uses the longest it measured when longer)
"""

from __future__ import annotations

import math
import re
import sys
import typing
from pathlib import Path
from typing import Any, Optional

import attrs

from yeto_core import serde
from yeto_core.breakers import BreakersConfig, validate_breakers
from yeto_core.errors import ConfigError
from yeto_core.records import SamplingParams

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")

#: Schedulers yeto-core ships; others may come from plugins (checked by preflight).
SCHEDULERS = ("s1", "always-on")


@attrs.frozen
class ModelConfig:
    """The model to train: a directory the backend and engines load."""

    path: str
    base_options: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class TaskConfig:
    """The task samplers dispense (registered through ``yeto_register_tasks``)."""

    name: str
    options: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class SamplerIslandConfig:
    """One group of identical sampler islands."""

    engine: str
    name: str = "sampler"
    count: int = 1
    group_size: int = 8
    prompts_per_call: int = 1
    min_round_s: float = 0.0
    #: Throttle: after every ``pause_every_s`` of sampling, sample nothing for ``pause_s``.
    pause_every_s: float = 0.0
    pause_s: float = 0.0
    backlog_cap: int = 64
    #: Synchronous GRPO (baseline, ``yeto bench e2e``): before its (n+1)-th generate call
    #: an island waits until it serves policy version >= n (the release trained on round n).
    sync_rounds: bool = False
    price_per_hour: float = 0.0
    engine_options: dict[str, Any] = attrs.field(factory=dict)
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    #: The island provider that runs these islands, and its options for each launch.
    provider: str = "local"
    provider_options: dict[str, Any] = attrs.field(factory=dict)
    #: Node class (docs/conversion.md): ``fixed`` islands only sample; ``convertible``
    #: ones may be turned into the trainer by ``[conversion]`` (never spot ones, never
    #: a precision other than the trainer's).
    node_class: str = "fixed"
    spot: bool = False
    precision: str = ""

    def island_names(self) -> list[str]:
        """The islands of this group: ``<name>-0``, ``<name>-1``, ..."""
        return [f"{self.name}-{i}" for i in range(self.count)]


@attrs.frozen
class TrainerConfig:
    """The trainer: backend, round size and the policy-age gate."""

    backend: str
    backend_options: dict[str, Any] = attrs.field(factory=dict)
    groups_per_round: int = 4
    max_policy_age: int = 2
    #: Rounds to train before the run finishes (0: until a backstop or ``yeto run down``).
    total_rounds: int = 0
    price_per_hour: float = 0.0
    name: str = "trainer"
    #: ``remote``: each incarnation is an island (``provider``) driven through the store;
    #: ``driver``: the trainer runs inside the head's process.
    lifecycle: str = "remote"
    provider: str = "local"
    provider_options: dict[str, Any] = attrs.field(factory=dict)
    #: The trainer's numeric precision; a convertible sampler group must match it.
    precision: str = ""


@attrs.frozen
class BufferConfig:
    """The durable sample buffer: implementation, index layout and options."""

    kind: str = "file"
    layout: str = "auto"
    options: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ConversionConfig:
    """How nodes convert between the sampler and trainer roles (``none``: they do not)."""

    name: str = "none"
    options: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class DispenserConfig:
    """How sampler islands get their prompts (``docs/dispenser.md``).

    ``offsets``: each incarnation walks its own seeded range of task indices.
    ``store``: dispense positions claimed from the store in ranges, exactly once per
    run (:mod:`yeto_core.dispenser`); ``rows`` is the task's row count (0: unbounded),
    ``range_size`` the positions per claim (0: the group's ``prompts_per_call``),
    ``lease_s`` how long a claim is held before others may re-dispense it.
    """

    kind: str = "offsets"
    rows: int = 0
    range_size: int = 0
    lease_s: float = 600.0


@attrs.frozen
class SchedulerConfig:
    """Which rule starts and stops the trainer, and its knobs."""

    name: str = "s1"
    options: dict[str, Any] = attrs.field(factory=dict)
    tick_s: float = 0.5
    #: seconds a head's lease in the store lasts unless renewed (every third of it)
    head_lease_s: float = 30.0


@attrs.frozen
class BackstopsConfig:
    """Limits that stop the run cleanly (final cut, samplers stopped). 0 means no limit."""

    budget_usd: float = 0.0
    wall_clock_s: float = 0.0
    silence_s: float = 0.0


@attrs.frozen
class CostConfig:
    """The cost guard's knobs (docs/cost.md); the budget is ``backstops.budget_usd``."""

    #: ``provider``: the price a provider reports (``IslandProvider.price_per_hour``),
    #: else the table's ``price_per_hour``; ``config``: always ``price_per_hour``.
    prices: str = "provider"
    #: When the projected spend reaches this share of the budget, the guard scales the
    #: pool down (samplers, then the trainer) before it stops the run at the budget.
    soft_fraction: float = 0.8
    #: The soft stage releases samplers down to this many (the trainer goes next).
    min_samplers: int = 1
    #: Seconds a sampler's verified release takes at least (the guard uses the longest
    #: release it measured when that is longer).
    sampler_release_s: float = 10.0
    #: Seconds a trainer's drain, cut and verified release take at least (or the longest
    #: measured).
    trainer_stop_s: float = 60.0
    #: Seconds between two decisions of the head at least (or the longest recent tick gap
    #: x 1.5: a tick that trains a round blocks for it).
    react_s: float = 5.0


@attrs.frozen
class ReleasesConfig:
    """How policy releases are stored: full, or deltas against the previous release."""

    #: ``auto``: deltas when the export's weights are at least ``delta_min_bytes``;
    #: ``on``: always (when a release codec is installed); ``off``: every release full.
    deltas: str = "auto"
    #: A full release at least every this many releases (bounds a follower's chain).
    full_every: int = 8
    #: The ``auto`` threshold in bytes of ``*.safetensors`` (64 MiB).
    delta_min_bytes: int = 64 * 1024 * 1024


@attrs.frozen
class RunConfig:
    """A whole run."""

    model: ModelConfig
    task: TaskConfig
    samplers: tuple[SamplerIslandConfig, ...]
    trainer: TrainerConfig
    name: str = "run"
    run_dir: str = ""
    store: str = ""
    seed: int = 0
    scheduler: SchedulerConfig = attrs.field(factory=SchedulerConfig)
    backstops: BackstopsConfig = attrs.field(factory=BackstopsConfig)
    buffer: BufferConfig = attrs.field(factory=BufferConfig)
    conversion: ConversionConfig = attrs.field(factory=ConversionConfig)
    breakers: BreakersConfig = attrs.field(factory=BreakersConfig)
    cost: CostConfig = attrs.field(factory=CostConfig)
    releases: ReleasesConfig = attrs.field(factory=ReleasesConfig)
    dispenser: DispenserConfig = attrs.field(factory=DispenserConfig)
    #: Where the config was read from (set by :func:`load_config`; not a TOML key).
    source: str = ""

    # -- derived -------------------------------------------------------------------

    def sampler_islands(self) -> list[tuple[str, SamplerIslandConfig]]:
        """Every sampler island with the group it belongs to."""
        return [(name, s) for s in self.samplers for name in s.island_names()]

    def island_prices(self) -> dict[str, float]:
        """Dollars per hour of each island (sampler islands and the trainer)."""
        prices = {name: s.price_per_hour for name, s in self.sampler_islands()}
        prices[self.trainer.name] = self.trainer.price_per_hour
        return prices

    @property
    def run_id(self) -> str:
        """The run's id in launch records and island environments (its ``name``)."""
        return self.name

    def providers(self) -> list[str]:
        """Every island provider the run uses (sampler groups first, then the trainer's)."""
        names = [s.provider for s in self.samplers]
        if self.trainer.lifecycle == "remote":
            names.append(self.trainer.provider)
        return list(dict.fromkeys(names))

    def store_url(self) -> str:
        """The store URL; the default is ``<run_dir>/store``."""
        return self.store or str(Path(self.run_dir) / "store")


#: Keys that are set by the loader, never by the TOML.
_INTERNAL_KEYS = {"source"}


def _field_type(cls: type, name: str) -> Any:
    hints = typing.get_type_hints(cls)
    return hints[name]


def _attrs_class_of(tp: Any) -> Optional[type]:
    """The attrs class a field holds, directly or as the element of a tuple."""
    if attrs.has(tp):
        return tp
    origin = typing.get_origin(tp)
    if origin is tuple:
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if len(args) == 1 and attrs.has(args[0]):
            return args[0]
    return None


def _check_keys(data: Any, cls: type, path: str) -> list[str]:
    """Unknown keys, each with its TOML path and the keys allowed there."""
    if not isinstance(data, dict):
        return []
    errors = []
    fields = {f.name: f for f in attrs.fields(cls) if f.name not in _INTERNAL_KEYS}
    for key in data:
        where = f"{path}.{key}" if path else key
        if key not in fields:
            errors.append(f"unknown key {where!r}; allowed keys here: {', '.join(sorted(fields))}")
            continue
        sub = _attrs_class_of(_field_type(cls, key))
        if sub is None:
            continue
        value = data[key]
        if isinstance(value, list):
            for i, item in enumerate(value):
                errors.extend(_check_keys(item, sub, f"{where}[{i}]"))
        else:
            errors.extend(_check_keys(value, sub, where))
    return errors


#: The largest value any numeric key may take (counts, sizes, seconds, dollars):
#: far above any real run, low enough that arithmetic on it stays exact.
MAX_NUMBER = 1e12


def _positive(
    errors: list[str],
    path: str,
    value: float,
    *,
    zero_ok: bool = False,
    most: float = MAX_NUMBER,
) -> None:
    """``value`` must be finite, > 0 (or >= 0 with ``zero_ok``) and at most ``most``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        errors.append(f"{path} = {value!r}; it must be a number")
        return
    if not math.isfinite(value):
        errors.append(f"{path} = {value!r}; it must be a finite number")
        return
    if value < 0 or (value == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        errors.append(f"{path} = {value!r}; it must be {bound}")
    elif value > most:
        errors.append(f"{path} = {value!r}; it must be at most {most:g}")


def validate(config: RunConfig) -> list[str]:
    """Value checks that types alone cannot express; each names its TOML path."""
    errors: list[str] = []
    if not _NAME_RE.match(config.name):
        errors.append(f"name = {config.name!r}; use lower-case letters, digits and '-'")
    if not config.run_dir:
        errors.append("run_dir is empty; set run_dir in the config or pass --run-dir DIR")
    if not config.model.path:
        errors.append("model.path is empty; give the model directory")
    if not config.task.name:
        errors.append("task.name is empty; give a task name (`yeto plugins` lists tasks)")
    if not config.samplers:
        errors.append("samplers: at least one [[samplers]] table is needed")
    seen: dict[str, str] = {}
    for i, s in enumerate(config.samplers):
        p = f"samplers[{i}]"
        if not _NAME_RE.match(s.name):
            errors.append(f"{p}.name = {s.name!r}; use lower-case letters, digits and '-'")
        if s.name in seen:
            errors.append(f"{p}.name = {s.name!r} is used by {seen[s.name]} too; names must differ")
        seen[s.name] = p
        if s.name == config.trainer.name:
            errors.append(f"{p}.name = {s.name!r} is the trainer's name; pick another")
        if not s.engine:
            errors.append(f"{p}.engine is empty; give an engine name such as 'hf'")
        if not s.provider:
            errors.append(f"{p}.provider is empty; give an island provider such as 'local'")
        _positive(errors, f"{p}.count", s.count, most=100_000)
        _positive(errors, f"{p}.group_size", s.group_size, most=65_536)
        if s.group_size == 1:
            errors.append(f"{p}.group_size = 1; GRPO needs at least 2 samples per prompt")
        _positive(errors, f"{p}.prompts_per_call", s.prompts_per_call, most=65_536)
        _positive(errors, f"{p}.min_round_s", s.min_round_s, zero_ok=True)
        _positive(errors, f"{p}.pause_every_s", s.pause_every_s, zero_ok=True)
        _positive(errors, f"{p}.pause_s", s.pause_s, zero_ok=True)
        if (s.pause_every_s > 0) != (s.pause_s > 0):
            errors.append(
                f"{p}.pause_every_s = {s.pause_every_s!r} and {p}.pause_s = {s.pause_s!r}; "
                "set both (a pause cycle) or neither"
            )
        _positive(errors, f"{p}.backlog_cap", s.backlog_cap)
        _positive(errors, f"{p}.price_per_hour", s.price_per_hour, zero_ok=True)
        sp = s.sampling
        _positive(errors, f"{p}.sampling.max_new_tokens", sp.max_new_tokens)
        _positive(errors, f"{p}.sampling.temperature", sp.temperature)
        if not (isinstance(sp.top_p, (int, float)) and 0 < sp.top_p <= 1):
            errors.append(f"{p}.sampling.top_p = {sp.top_p!r}; it must be in (0, 1]")
        _positive(errors, f"{p}.sampling.top_k", sp.top_k, zero_ok=True)
    t = config.trainer
    if not _NAME_RE.match(t.name):
        errors.append(f"trainer.name = {t.name!r}; use lower-case letters, digits and '-'")
    if not t.backend:
        errors.append("trainer.backend is empty; give a backend name such as 'torch'")
    if not t.lifecycle:
        errors.append("trainer.lifecycle is empty; use 'remote' or 'driver'")
    if not t.provider:
        errors.append("trainer.provider is empty; give an island provider such as 'local'")
    if not config.buffer.kind:
        errors.append("buffer.kind is empty; give a sample buffer such as 'file'")
    if not config.conversion.name:
        errors.append("conversion.name is empty; use 'none' when nodes do not convert")
    _positive(errors, "trainer.groups_per_round", t.groups_per_round)
    _positive(errors, "trainer.max_policy_age", t.max_policy_age, zero_ok=True)
    _positive(errors, "trainer.price_per_hour", t.price_per_hour, zero_ok=True)
    _positive(errors, "trainer.total_rounds", t.total_rounds, zero_ok=True)
    if not 0 <= config.seed < 2**63:
        errors.append(f"seed = {config.seed!r}; it must be an integer in [0, 2**63)")
    if not config.scheduler.name:
        errors.append(f"scheduler.name is empty; allowed: {', '.join(SCHEDULERS)}")
    _positive(errors, "scheduler.tick_s", config.scheduler.tick_s)
    _positive(errors, "scheduler.head_lease_s", config.scheduler.head_lease_s, most=86400.0)
    b = config.backstops
    _positive(errors, "backstops.budget_usd", b.budget_usd, zero_ok=True)
    _positive(errors, "backstops.wall_clock_s", b.wall_clock_s, zero_ok=True)
    _positive(errors, "backstops.silence_s", b.silence_s, zero_ok=True)
    validate_breakers(config.breakers, errors)
    c = config.cost
    if c.prices not in ("provider", "config"):
        errors.append(f"cost.prices = {c.prices!r}; allowed: 'provider', 'config'")
    if not (isinstance(c.soft_fraction, (int, float)) and 0 < c.soft_fraction <= 1):
        errors.append(f"cost.soft_fraction = {c.soft_fraction!r}; it must be in (0, 1]")
    _positive(errors, "cost.min_samplers", c.min_samplers, zero_ok=True, most=100_000)
    _positive(errors, "cost.sampler_release_s", c.sampler_release_s, zero_ok=True)
    _positive(errors, "cost.trainer_stop_s", c.trainer_stop_s, zero_ok=True)
    _positive(errors, "cost.react_s", c.react_s, zero_ok=True)
    r = config.releases
    if r.deltas not in ("auto", "on", "off"):
        errors.append(f"releases.deltas = {r.deltas!r}; allowed values are auto, on, off")
    if int(r.full_every) < 1:
        errors.append(f"releases.full_every = {r.full_every!r}; it must be >= 1")
    _positive(errors, "releases.delta_min_bytes", r.delta_min_bytes, zero_ok=True)
    d = config.dispenser
    if d.kind not in ("offsets", "store"):
        errors.append(f"dispenser.kind = {d.kind!r}; allowed: offsets, store")
    _positive(errors, "dispenser.rows", d.rows, zero_ok=True)
    _positive(errors, "dispenser.range_size", d.range_size, zero_ok=True, most=1_000_000)
    _positive(errors, "dispenser.lease_s", d.lease_s)
    errors.extend(_node_class_errors(config))
    return errors


#: The node classes of a sampler group (``[[samplers]] node_class``).
NODE_CLASSES = ("fixed", "convertible")


def _node_class_errors(config: RunConfig) -> list[str]:
    """The node-class rules (docs/conversion.md): which sampler groups may convert."""
    errors: list[str] = []
    convertible = 0
    for i, s in enumerate(config.samplers):
        p = f"samplers[{i}]"
        if s.node_class not in NODE_CLASSES:
            errors.append(f"{p}.node_class = {s.node_class!r}; allowed: {', '.join(NODE_CLASSES)}")
            continue
        if s.node_class != "convertible":
            continue
        convertible += 1
        if s.spot:
            errors.append(
                f"{p}.node_class = 'convertible' with spot = true; a spot node can be taken "
                "away mid-conversion and would take the trainer with it: make it 'fixed'"
            )
        if s.precision and config.trainer.precision and s.precision != config.trainer.precision:
            errors.append(
                f"{p}.precision = {s.precision!r} differs from trainer.precision = "
                f"{config.trainer.precision!r}; a convertible node must train in the "
                "trainer's precision: make it 'fixed' or align the precisions"
            )
    islands = sum(s.count for s in config.samplers)
    if convertible and config.conversion.name == "none":
        errors.append(
            "samplers declare node_class = 'convertible' but conversion.name = 'none'; set "
            "[conversion] name = 'local' (or a provider's conversion), or make them 'fixed'"
        )
    if config.conversion.name != "none" and convertible:
        if islands < 2:
            errors.append(
                f"conversion.name = {config.conversion.name!r} with {islands} sampler island: "
                "the last node that samples never converts; add a sampler island"
            )
        if config.trainer.lifecycle != "remote":
            errors.append(
                f"conversion.name = {config.conversion.name!r} needs trainer.lifecycle = "
                f"'remote' (the trainer runs on a converted node), not "
                f"{config.trainer.lifecycle!r}"
            )
    return errors


def parse_config(
    data: dict[str, Any], *, source: str = "<config>", run_dir: Optional[str] = None
) -> RunConfig:
    """Structure a parsed TOML document into a :class:`RunConfig`.

    :param data: the TOML document as plain data.
    :param source: where it came from (shown in errors).
    :param run_dir: overrides ``run_dir`` (``--run-dir``).
    :raises ConfigError: naming every unknown key or bad value with its path.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a run config is a TOML table")
    data = dict(data)
    if run_dir is not None:
        data["run_dir"] = str(run_dir)
    errors = _check_keys(data, RunConfig, "")
    if errors:
        raise ConfigError(f"{source}: invalid run config:\n  " + "\n  ".join(errors))
    try:
        config = serde.structure(data, RunConfig, what=f"run config {source}", root="")
    except ConfigError as exc:
        # cattrs writes paths as ``.trainer.batch``; the TOML path is ``trainer.batch``.
        raise ConfigError(str(exc).replace("@ .", "@ ")) from None
    config = attrs.evolve(config, source=source)
    errors = validate(config)
    if errors:
        raise ConfigError(f"{source}: invalid run config:\n  " + "\n  ".join(errors))
    return config


def load_config(path: str | Path, *, run_dir: Optional[str] = None) -> RunConfig:
    """Read and check a TOML run config.

    Relative ``run_dir``, ``store`` (a path) and ``model.path`` stay relative to
    the working directory, as a user typing ``yeto run up`` expects.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read run config {str(path)!r}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(data, source=str(path), run_dir=run_dir)


def config_to_dict(config: RunConfig) -> dict[str, Any]:
    """Plain data for ``config.json`` in the run dir (islands read it back)."""
    return serde.unstructure(config)


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """The inverse of :func:`config_to_dict` (no TOML checks: the head already ran them)."""
    return serde.structure(data, RunConfig, what="run config (config.json)")
