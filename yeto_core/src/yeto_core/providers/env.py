"""The environment of an island: the store URL and ids, nothing from the head's machine.

The head builds one :class:`~yeto_core.records.IslandLaunch` per island
incarnation with :func:`island_launch`; its ``env`` holds exactly:

- ``YETO_STORE``: the run's store URL (absolute; the island opens it through its plugins);
- ``YETO_RUN_ID``: the run's id (``name`` in the run config);
- ``YETO_ROLE``: ``sampler`` or ``trainer``;
- ``YETO_ISLAND`` / ``YETO_INCARNATION``: which island and incarnation this is;
- ``YETO_TRAINER_CUT`` (trainer, optional): the cut id to restore (default: the newest);
- the store's explicit credentials (:meth:`~yeto_core.ports.ObjectStore.credentials_env`,
  e.g. ``YETO_STORE_S3_*``);
- ``YETO_CPUS`` (optional, set by a provider such as ``local`` from its ``cpus`` option):
  the CPUs the island process pins itself to before anything else (:func:`pin_cpus`);
- ``YETO_START_SUBMITTED_UNIX`` (set by the provider at each launch,
  :func:`stamp_submitted`): when this incarnation was submitted (seconds since the epoch,
  the head host's clock). A trainer measures its start (``trainer_start_summary.start_s``,
  S1's ``T_s``) from it, so provisioning, image pull and imports count.
- ``YETO_VERSIONS`` (optional, set by a remote provider such as ``modal`` or ``sky``): the
  run's yeto distributions and versions; an island whose installed ones differ refuses to
  start (:func:`yeto_core.providers.dists.check_version_lock`).

Everything else (the resolved config, the base model, releases) the island
reads from the store (:mod:`yeto_core.config.run_store`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from typing import Any, Optional

import attrs

from yeto_core.errors import ConfigError
from yeto_core.ports import ObjectStore
from yeto_core.records import ROLES, IslandLaunch

ENV_STORE = "YETO_STORE"
ENV_RUN_ID = "YETO_RUN_ID"
ENV_ROLE = "YETO_ROLE"
ENV_ISLAND = "YETO_ISLAND"
ENV_INCARNATION = "YETO_INCARNATION"
ENV_CUT = "YETO_TRAINER_CUT"
ENV_CPUS = "YETO_CPUS"
ENV_START_SUBMITTED = "YETO_START_SUBMITTED_UNIX"
ENV_VERSIONS = "YETO_VERSIONS"

#: Every variable an island reads (besides the store's credentials).
ISLAND_VARIABLES = (
    ENV_STORE,
    ENV_RUN_ID,
    ENV_ROLE,
    ENV_ISLAND,
    ENV_INCARNATION,
    ENV_CUT,
    ENV_CPUS,
    ENV_START_SUBMITTED,
    ENV_VERSIONS,
)


def stamp_submitted(env: Mapping[str, str], now: Optional[float] = None) -> dict[str, str]:
    """``env`` with ``YETO_START_SUBMITTED_UNIX`` set to ``now`` (default: ``time.time()``).

    Every provider calls it when it submits a launch, so each incarnation carries its own
    submission time (a launch record reused for another incarnation keeps none of it).
    """
    out = dict(env)
    out[ENV_START_SUBMITTED] = repr(float(time.time() if now is None else now))
    return out


def parse_cpus(value: Any) -> list[int]:
    """CPU numbers from a list (``[0, 1]``) or a string (``"0-3,6"``), sorted.

    :raises ConfigError: not CPU numbers, or none.
    """
    items: list[Any]
    if isinstance(value, str):
        items = [p.strip() for p in value.split(",") if p.strip()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    cpus: set[int] = set()
    try:
        for item in items:
            if isinstance(item, bool):
                raise ValueError(item)
            if isinstance(item, str) and "-" in item:
                lo, hi = (int(x) for x in item.split("-", 1))
                if lo > hi:
                    raise ValueError(item)
                cpus.update(range(lo, hi + 1))
            else:
                cpus.add(int(item))
    except (ValueError, TypeError):
        cpus = set()
    if not cpus or min(cpus) < 0:
        raise ConfigError(
            f"cpus = {value!r}: give CPU numbers as a list ([0, 1]) or a string ('0-3,6')"
        )
    return sorted(cpus)


def pin_cpus(env: Mapping[str, str]) -> Optional[list[int]]:
    """Pin this process (the calling thread, and every thread and child it starts later)
    to the CPUs ``YETO_CPUS`` names. :returns: those CPUs, or None when it names none."""
    raw = env.get(ENV_CPUS)
    if not raw:
        return None
    cpus = parse_cpus(raw)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        raise ConfigError(f"{ENV_CPUS}={raw!r}: cannot pin to CPUs {cpus}: {exc}") from exc
    return cpus


@attrs.frozen
class IslandIdentity:
    """What an island learns from its environment."""

    store_url: str
    run_id: str
    role: str
    island: str
    incarnation: int
    cut: Optional[str] = None
    #: ``YETO_START_SUBMITTED_UNIX`` (None: absent or not a number)
    start_submitted_unix: Optional[float] = None


def island_launch(
    store: ObjectStore,
    *,
    run_id: str,
    role: str,
    island: str,
    incarnation: int,
    options: Optional[Mapping[str, Any]] = None,
    cut: Optional[str] = None,
) -> IslandLaunch:
    """The launch record of one island incarnation (its ``env`` is all the island needs)."""
    if role not in ROLES:
        raise ConfigError(f"island role {role!r} is unknown; use one of {ROLES}")
    url = store.url()
    env = dict(store.credentials_env())
    env.update(
        {
            ENV_STORE: url,
            ENV_RUN_ID: run_id,
            ENV_ROLE: role,
            ENV_ISLAND: island,
            ENV_INCARNATION: str(int(incarnation)),
        }
    )
    if cut:
        env[ENV_CUT] = cut
    return IslandLaunch(
        run_id=run_id,
        store_url=url,
        role=role,
        island=island,
        incarnation=int(incarnation),
        env=env,
        options=dict(options or {}),
    )


def relaunch(launch: IslandLaunch, incarnation: int, cut: Optional[str] = None) -> IslandLaunch:
    """The same island's launch record for another incarnation (and cut)."""
    env = dict(launch.env)
    env[ENV_INCARNATION] = str(int(incarnation))
    env.pop(ENV_CUT, None)
    env.pop(ENV_START_SUBMITTED, None)  # the provider stamps the new launch
    if cut:
        env[ENV_CUT] = cut
    return attrs.evolve(launch, incarnation=int(incarnation), env=env)


def identity_from_env(env: Mapping[str, str]) -> IslandIdentity:
    """Parse an island's environment; a missing variable is a :class:`ConfigError`."""
    missing = [k for k in (ENV_STORE, ENV_ROLE, ENV_ISLAND, ENV_INCARNATION) if not env.get(k)]
    if missing:
        raise ConfigError(
            f"this island's environment lacks {', '.join(missing)}; islands are started by "
            "`yeto run up` through an island provider, which sets them"
        )
    try:
        incarnation = int(env[ENV_INCARNATION])
    except ValueError:
        raise ConfigError(f"{ENV_INCARNATION}={env[ENV_INCARNATION]!r} is not an integer") from None
    return IslandIdentity(
        store_url=env[ENV_STORE],
        run_id=env.get(ENV_RUN_ID, ""),
        role=env[ENV_ROLE],
        island=env[ENV_ISLAND],
        incarnation=incarnation,
        cut=env.get(ENV_CUT) or None,
        start_submitted_unix=_submitted(env.get(ENV_START_SUBMITTED)),
    )


def _submitted(raw: Optional[str]) -> Optional[float]:
    """The submission stamp, or None (absent or unusable: the start is measured in process)."""
    try:
        value = float(raw) if raw else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None
