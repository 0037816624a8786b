"""Evaluation of policy releases on a held-out task, off the training path (``[eval]``).

The evaluating sampler island runs a :class:`ReleaseEvaluator` on a thread beside its
:class:`~yeto_core.sampler.loop.SamplerLoop`. When the follower serves a release that is
due (:func:`due`), the evaluator holds the follower's update lock, as a sampling call
does, so it runs between the island's training calls and no load changes the weights
under it. It generates from the held-out task's first ``max_prompts`` prompts, scores
each completion with the task's reward (the same ``Reward`` port as training) and emits
one ``eval_result`` event with the release's metrics.

Nothing it generates goes near the sample buffer or the dispenser: the held-out prompts
are read by index from their own task, and the groups live only in this module.

A reward that raises or returns a non-finite value is counted (``skipped``:
``reward_failed``, ``nonfinite_reward``) and left out of the metrics, never scored 0. A
forced load that landed in the evaluation (it outlived the follower's
``reload_max_defer_s``) throws its result away (``eval_discarded``); the release then
served is evaluated when due.

Each release is evaluated once per run: the island starts the evaluator with the
releases its event stream already holds (``done``), so a restarted island skips them,
and :mod:`yeto_core.events.summary` counts a release once by its id.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Optional

import attrs

from yeto_core.ports.sampler import Task, encode_prompt, prompt_record, score_prompt
from yeto_core.records import Event, Prompt, SamplingParams
from yeto_core.sampler.interfaces import Follower

#: the key of the base policy (version 0, before any release) in ``eval_result`` events
BASE = "base"


def due(
    version: int,
    key: str,
    done: dict[str, int],
    *,
    every_versions: int,
    base: bool,
) -> bool:
    """Whether the policy served now (``version``, release ``key``) is to be evaluated.

    :param done: key -> policy version of every release already evaluated.
    :param every_versions: evaluate a release at least this many policy versions after
        the newest one evaluated (the base counts as version 0).
    :param base: evaluate the base policy (version 0).
    """
    if key in done:
        return False
    if version <= 0:
        return base and key == BASE
    last = max(done.values(), default=0)
    return version >= last + every_versions


def eval_prompts(task: Any, max_prompts: int) -> list[Prompt]:
    """The held-out prompts: the task's first ``max_prompts`` rows (0: every row)."""
    rows = int(task.rows) if isinstance(task, Task) else 0
    if rows and max_prompts:
        n = min(rows, max_prompts)
    else:
        n = rows or max_prompts
    if n <= 0:
        raise ValueError(
            "the eval task has no row count (unbounded): set [eval] max_prompts to the "
            "number of prompts each evaluation scores"
        )
    return [prompt_record(task, i, 0) for i in range(n)]


def eval_sampling(
    sampling: SamplingParams,
    *,
    greedy: bool,
    temperature: float = 0.0,
    max_new_tokens: int = 0,
) -> SamplingParams:
    """The decoding of an evaluation, from the island's ``sampling``.

    Greedy is the one most likely token at each step: top-k = 1 (every engine takes it
    the same way). Sampled: the island's sampling with ``temperature`` (0: its own).
    """
    out = {"top_logprobs": 0}
    if max_new_tokens:
        out["max_new_tokens"] = int(max_new_tokens)
    if greedy:
        out.update(temperature=1.0, top_k=1, top_p=1.0)
    elif temperature:
        out["temperature"] = float(temperature)
    return attrs.evolve(sampling, **out)


def eval_metrics(
    rewards: Sequence[Sequence[float]], lengths: Sequence[int], truncated: int
) -> dict[str, Optional[float]]:
    """The metrics of one evaluation (pure).

    :param rewards: per prompt, the rewards of its scored completions (a completion
        whose reward failed is absent, never a 0).
    :param lengths: the token count of every completion.
    :param truncated: completions cut at ``max_new_tokens``.
    """
    flat = [r for rs in rewards for r in rs]
    best = [max(rs) for rs in rewards if rs]
    out: dict[str, Optional[float]] = {
        "reward_mean": sum(flat) / len(flat) if flat else None,
        "reward_best_mean": sum(best) / len(best) if best else None,
        "length_mean": sum(lengths) / len(lengths) if lengths else None,
        "truncated_fraction": truncated / len(lengths) if lengths else None,
    }
    return {k: (None if v is None else round(float(v), 6)) for k, v in out.items()}


class ReleaseEvaluator:
    """Evaluate the releases ``follower`` serves on the held-out ``prompts``.

    :param engine: the island's :class:`~yeto_core.ports.SamplerEngine`.
    :param task: the held-out task (its reward scores the completions).
    :param follower: the island's follower (its update lock, version and release id).
    :param prompts: the held-out prompts (:func:`eval_prompts`).
    :param sampling: the decoding (:func:`eval_sampling`).
    :param greedy: whether ``sampling`` is greedy (reported with each result).
    :param samples_per_prompt: completions per prompt.
    :param batch: prompts per generate call.
    :param every_versions: see :func:`due`.
    :param base: evaluate the base policy (version 0) too.
    :param done: (key, version) of the releases already evaluated (the eval stream's).
    :param emit: called with every event (``eval_result``, ``eval_discarded``,
        ``eval_failed``).
    :param source: the island's name (events' source).
    :param on_close: called by :meth:`close` once the thread stopped (the island closes
        its eval stream there).
    """

    def __init__(
        self,
        engine: Any,
        task: Any,
        follower: Follower,
        *,
        prompts: Sequence[Prompt],
        sampling: SamplingParams,
        greedy: bool = True,
        samples_per_prompt: int = 1,
        batch: int = 8,
        every_versions: int = 1,
        base: bool = True,
        done: Iterable[tuple[str, int]] = (),
        emit: Optional[Callable[[Event], None]] = None,
        source: str = "sampler",
        incarnation: int = 0,
        stop: Optional[threading.Event] = None,
        clock: Callable[[], float] = time.time,
        on_close: Optional[Callable[[], None]] = None,
    ) -> None:
        if samples_per_prompt < 1:
            raise ValueError(f"samples_per_prompt={samples_per_prompt}: must be >= 1")
        self.engine, self.task, self.follower = engine, task, follower
        self.prompts = list(prompts)
        self.sampling, self.greedy = sampling, bool(greedy)
        self.samples_per_prompt = int(samples_per_prompt)
        self.batch = max(1, int(batch))
        self.every_versions = max(1, int(every_versions))
        self.base = bool(base)
        self.done: dict[str, int] = {str(k): int(v) for k, v in done}
        self._emit = emit or (lambda e: None)
        self.source, self.incarnation = source, int(incarnation)
        self.stop = stop or threading.Event()
        self.clock = clock
        self._on_close = on_close
        #: releases whose evaluation raised (not tried again by this incarnation)
        self.failed: set[str] = set()
        self.evaluations = 0
        self._thread: Optional[threading.Thread] = None

    def _event(self, kind: str, **data: Any) -> None:
        data = {**data, "island": self.source}  # the eval stream's events name their island
        self._emit(Event(kind=kind, time=self.clock(), source=self.source, data=data))

    def served(self) -> tuple[int, str]:
        """(version, key) of the policy the follower serves now."""
        version = int(self.follower.version)
        rid = self.follower.release_id
        return version, (str(rid) if rid else BASE)

    def pending(self) -> bool:
        """Whether the policy served now is due and not failed before."""
        version, key = self.served()
        if key in self.failed:
            return False
        return due(version, key, self.done, every_versions=self.every_versions, base=self.base)

    def evaluate_once(self) -> Optional[dict[str, Any]]:
        """Evaluate the policy served now when it is due.

        :returns: the ``eval_result`` event's data (None: nothing due, or the result was
            thrown away).
        """
        if not self.pending():
            return None
        started = self.clock()
        with self.follower.round() as version:
            version, key = self.served()  # what serves under the lock
            if key in self.done or key in self.failed:
                return None
            try:
                data = self._run(version, key)
            except InterruptedError:  # the island stops: the next incarnation evaluates it
                return None
            except Exception as exc:
                self.failed.add(key)
                self._event(
                    "eval_failed",
                    release_id=key,
                    version=version,
                    error=f"{type(exc).__name__}: {exc}"[:500],
                    incarnation=self.incarnation,
                )
                return None
        if self.follower.last_round_straddled:  # a forced load swapped weights mid-eval
            self._event(
                "eval_discarded",
                release_id=key,
                version=version,
                reason="forced_reload",
                incarnation=self.incarnation,
            )
            return None
        data["seconds"] = round(self.clock() - started, 3)
        self.done[key] = version
        self.evaluations += 1
        self._event("eval_result", **data)
        return data

    def _run(self, version: int, key: str) -> dict[str, Any]:
        """Generate and score the held-out prompts under the policy served now."""
        rewards: list[list[float]] = []
        lengths: list[int] = []
        truncated = 0
        skipped: dict[str, int] = {}
        for start in range(0, len(self.prompts), self.batch):
            if self.stop.is_set():
                raise InterruptedError("the island stopped mid-evaluation")
            chunk = self.prompts[start : start + self.batch]
            ids = [encode_prompt(self.engine, p) for p in chunk]
            outs = self.engine.generate(ids, self.samples_per_prompt, self.sampling)
            if len(outs) != len(chunk):
                raise RuntimeError(
                    f"engine {type(self.engine).__name__} returned {len(outs)} groups for "
                    f"{len(chunk)} prompts"
                )
            for prompt, comps in zip(chunk, outs, strict=True):
                scored: list[float] = []
                for c in comps:
                    lengths.append(len(c.tokens))
                    truncated += c.finish_reason == "length"
                    text = self.engine.decode(c.tokens)
                    try:
                        reward = float(score_prompt(self.task, prompt, text))
                    except Exception:  # a user's reward: counted, never a 0
                        skipped["reward_failed"] = skipped.get("reward_failed", 0) + 1
                        continue
                    if not math.isfinite(reward):
                        skipped["nonfinite_reward"] = skipped.get("nonfinite_reward", 0) + 1
                        continue
                    scored.append(reward)
                rewards.append(scored)
        return {
            "release_id": key,
            "version": version,
            "metrics": eval_metrics(rewards, lengths, truncated),
            "prompts": len(self.prompts),
            "samples": len(lengths),
            "scored": sum(len(r) for r in rewards),
            "skipped": skipped,
            "greedy": self.greedy,
            "temperature": self.sampling.temperature,
            "incarnation": self.incarnation,
        }

    # -- the thread ---------------------------------------------------------------------

    def run(self, poll_s: float = 0.5) -> None:
        """Evaluate every due release until ``stop`` (the thread's body)."""
        while not self.stop.is_set():
            self.evaluate_once()
            version = int(self.follower.version)
            woke = self.follower.wait_version(version + 1, poll_s)
            if woke is None and self.stop.wait(poll_s):
                return

    def start(self, poll_s: float = 0.5) -> None:
        self._thread = threading.Thread(
            target=self.run, args=(poll_s,), name=f"yeto-eval-{self.source}", daemon=True
        )
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (an evaluation in flight ends at its next generate call)."""
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._on_close is not None:  # (the island's eval stream: written and marked)
            self._on_close()
