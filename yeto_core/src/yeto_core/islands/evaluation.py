"""The evaluating sampler island's side of ``[eval]``: the held-out task, the ``eval``
event stream and the :class:`~yeto_core.sampler.evaluation.ReleaseEvaluator` thread.

:func:`start_evaluation` is called by :func:`yeto_core.islands.main.run_sampler` on every
sampler island; it starts nothing unless this island is the one ``[eval]`` names.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from yeto_core.config.evaluation import EVAL_STREAM, eval_island
from yeto_core.config.load import RunConfig, SamplerIslandConfig
from yeto_core.events.stream import EventStream, read_events
from yeto_core.sampler.evaluation import ReleaseEvaluator, eval_prompts, eval_sampling


def evaluated_releases(stream: EventStream) -> list[tuple[str, int]]:
    """(release key, version) of every ``eval_result`` the eval stream holds (every
    incarnation's, this writer's unflushed ones too), each once."""
    found = (
        (str(e.data["release_id"]), int(e.data["version"]))
        for e in [*read_events(stream.store, stream.island), *stream.events()]
        if e.kind == "eval_result" and "release_id" in e.data and "version" in e.data
    )
    return list(dict.fromkeys(found))


def close_quietly(stream: EventStream) -> None:
    """Close ``stream`` at an island's end without ending its other cleanup: a store that
    fails now leaves the object unmarked (read at every poll, as a killed writer's)."""
    try:
        stream.close()
    except Exception:
        pass


def start_evaluation(
    plugins: Any,
    store: Any,
    config: RunConfig,
    scfg: SamplerIslandConfig,
    *,
    island: str,
    incarnation: int,
    engine: Any,
    follower: Any,
    stop: threading.Event,
    start: bool = True,
) -> Optional[ReleaseEvaluator]:
    """Start the evaluator thread when ``island`` evaluates (None: it does not).

    The releases the ``eval`` stream already holds are not evaluated again (a restarted
    island continues where its predecessor stopped). ``start=False``: built, not started
    (the caller drives :meth:`~ReleaseEvaluator.evaluate_once`)."""
    if eval_island(config) != island:
        return None
    e = config.eval
    task = plugins.task(e.task.name).from_config(e.task.options, plugins=plugins)
    stream = EventStream(store, EVAL_STREAM, flush_s=0.0, observer=plugins.emit)
    sampling = eval_sampling(
        engine.behaviour_sampling(scfg.engine_sampling()),
        greedy=e.greedy,
        temperature=e.temperature,
        max_new_tokens=e.max_new_tokens,
    )

    def emit(event: Any) -> None:
        stream.emit(event.kind, **dict(event.data))

    evaluator = ReleaseEvaluator(
        engine,
        task,
        follower,
        prompts=eval_prompts(task, e.max_prompts),
        sampling=sampling,
        greedy=e.greedy,
        samples_per_prompt=e.samples_per_prompt,
        batch=scfg.prompts_per_call,
        every_versions=e.every_releases * config.trainer.publish_every,
        base=e.base,
        done=evaluated_releases(stream),
        emit=emit,
        source=island,
        incarnation=incarnation,
        stop=stop,
        on_close=lambda: close_quietly(stream),  # its marker once the evaluator stopped
    )
    if start:
        evaluator.start()
    return evaluator
