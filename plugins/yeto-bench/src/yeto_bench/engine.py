"""``yeto bench engine --engine vllm``: a server-backed engine against bare calls on the same server.

One real server (started by the engine, float32, on 127.0.0.1) serves the warm
sort4 base. In the same run, ``--repeat`` times:

- ``throughput_ratio``: generated tokens/s through ``engine.generate`` (requests
  built, sent concurrently, answers decoded into completions with log-probs and
  weight versions) over a bare httpx loop posting the **same request bodies**
  with the same concurrency and only parsing the JSON (goal >= 0.9), over
  ``--trials`` calls a side in ABBA order, summed per side;
- ``reload_overhead_ratio``: release published -> verified serving (the policy
  follower: fetch with digest checks, ``reload_weights`` + ``reset_prefix_cache``
  + ``update_weight_version``, then the fingerprint's probe log-probs) over the
  bare ``reload_weights`` call of the same directory; ``fingerprint_share`` is
  the fingerprint's part of the former.

Medians over the repetitions; every repetition is in ``per_repeat``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import click

from yeto_core.cli import exit_codes

ROOT = Path(__file__).resolve().parents[4]


def _default_python() -> str:
    env = os.environ.get("YETO_VLLM_PYTHON")
    if env:
        return env
    cand = ROOT / "build" / "vllm-venv" / "bin" / "python"
    if cand.exists():
        return str(cand)
    raise click.UsageError(
        "no vLLM server environment: run `make vllm-venv` or set YETO_VLLM_PYTHON / --python"
    )


def bare_generate(
    http: Any, pool: ThreadPoolExecutor, url: str, bodies: list[dict[str, Any]]
) -> int:
    """POST the bodies concurrently with a plain httpx client; :returns: generated tokens."""

    def one(body: dict[str, Any]) -> int:
        r = http.post(url + "/inference/v1/generate", json=body)
        r.raise_for_status()
        return sum(len(c["token_ids"]) for c in r.json()["choices"])

    return sum(pool.map(one, bodies))


def run(
    *,
    engine_name: str,
    python: str,
    repeat: int,
    prompts: int,
    n: int,
    max_new_tokens: int,
    releases: int,
    work: Path,
    progress: Callable[[str], None],
    eager: bool = True,
    trials: int = 8,
) -> dict[str, Any]:
    import torch

    from yeto_core.plugins import Plugins
    from yeto_core.records import SamplingParams
    from yeto_core.release.store import ReleaseStore
    from yeto_core.sampler import fingerprint as fp
    from yeto_core.sampler.follower import PolicyFollower
    from yeto_core.stores.dir_store import DirStore
    from yeto_torch import model as tiny
    from yeto_torch.export import export_full
    from yeto_torch.sampling import prompt_logprobs
    from yeto_torch.tasks import SortDigits
    from yeto_torch.warmup import make_base

    if engine_name != "vllm":
        raise click.UsageError(f"--engine {engine_name!r}: this bench knows vllm")
    torch.set_num_threads(1)
    progress("building the warm sort4 base")
    base = make_base(work / "base", "sort4", seed=0)
    engine_cls = Plugins().sampler_engine(engine_name)
    progress("starting the vLLM server (30-120 s)")
    t0 = time.monotonic()
    engine = engine_cls(
        str(base),
        python=python,
        log_dir=str(work / "logs"),
        seed=0,
        enforce_eager=eager,
        start_timeout_s=900,
    )
    start_s = time.monotonic() - t0
    try:
        task = SortDigits(seed=0)
        ids = [engine.encode(task.prompt(i)[0]) for i in range(prompts)]
        sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=1)
        import httpx

        http = httpx.Client(timeout=300)  # kept alive like the engine's own client
        pool = ThreadPoolExecutor(len(ids))
        engine.generate(ids, n, sp)  # warm both paths once
        bare_generate(http, pool, engine.url, engine.generate_bodies(ids, n, sp))
        per: list[dict[str, Any]] = []
        store = ReleaseStore(DirStore(work / "store"))
        follower = PolicyFollower(store, engine, work_dir=work / "follower")
        version = 0
        for r in range(repeat):
            progress(f"repetition {r + 1}/{repeat}: throughput")

            def through_engine() -> tuple[int, float]:
                t = time.perf_counter()
                out = engine.generate(ids, n, sp)
                return sum(len(c.tokens) for g in out for c in g), time.perf_counter() - t

            def bare() -> tuple[int, float]:
                bodies = engine.generate_bodies(ids, n, sp)
                t = time.perf_counter()
                return bare_generate(http, pool, engine.url, bodies), time.perf_counter() - t

            # ABBA-ordered trials, summed per side: load from other work on the machine
            # and the server's warm state fall on both sides alike
            eng_tokens = eng_s = bare_tokens = bare_s = 0.0
            for k in range(trials):
                order = (through_engine, bare) if k % 4 in (0, 3) else (bare, through_engine)
                for fn in order:
                    tokens, secs = fn()
                    if fn is bare:
                        bare_tokens, bare_s = bare_tokens + tokens, bare_s + secs
                    else:
                        eng_tokens, eng_s = eng_tokens + tokens, eng_s + secs
            rep: dict[str, Any] = {
                "engine_tokens_per_s": eng_tokens / eng_s,
                "bare_tokens_per_s": bare_tokens / bare_s,
            }
            rep["throughput_ratio"] = rep["engine_tokens_per_s"] / rep["bare_tokens_per_s"]
            progress(f"repetition {r + 1}/{repeat}: {releases} releases")
            verified, bare_reload, fps = [], [], []
            for k in range(releases):
                version += 1
                m = tiny.load_model(base).eval()
                g = torch.Generator().manual_seed(version)
                with torch.no_grad():
                    for p in m.parameters():
                        p.add_(torch.randn(p.shape, generator=g) * 0.01)
                out_dir = work / f"export-{version}"
                info = export_full(m, base, out_dir)
                probes = fp.probe_set(int(m.config.vocab_size))
                info[fp.INFO_KEY] = fp.record(
                    lambda q, m=m: prompt_logprobs(m, q), probes
                ).to_json()
                info["version"] = version
                store.publish(out_dir, info)
                t = time.perf_counter()
                status = follower.poll()
                verified.append(time.perf_counter() - t)
                if status != "loaded" or follower.last_check is None or not follower.last_check.ok:
                    raise RuntimeError(f"release {version} was not verified: {status}")
                fps.append(follower.last_fingerprint_s)
                bare_reload.append(engine.reload_weights_raw(str(out_dir)))  # the same bytes
                shutil.rmtree(out_dir, ignore_errors=True)
                del k
            rep["verified_serving_s"] = statistics.median(verified)
            rep["bare_reload_s"] = statistics.median(bare_reload)
            rep["fingerprint_s"] = statistics.median(fps)
            rep["reload_overhead_ratio"] = rep["verified_serving_s"] / rep["bare_reload_s"]
            rep["fingerprint_share"] = rep["fingerprint_s"] / rep["verified_serving_s"]
            per.append(rep)
        http.close()
        pool.shutdown()
    finally:
        engine.close()

    def med(key: str) -> float:
        return round(statistics.median(p[key] for p in per), 6)

    return {
        "bench": "engine",
        "engine": engine_name,
        "throughput_ratio": med("throughput_ratio"),
        "engine_tokens_per_s": med("engine_tokens_per_s"),
        "bare_tokens_per_s": med("bare_tokens_per_s"),
        "reload_overhead_ratio": med("reload_overhead_ratio"),
        "verified_serving_s": med("verified_serving_s"),
        "bare_reload_s": med("bare_reload_s"),
        "fingerprint_s": med("fingerprint_s"),
        "fingerprint_share": med("fingerprint_share"),
        "server_start_s": round(start_s, 3),
        "enforce_eager": eager,
        "requests": {"prompts": prompts, "n": n, "max_new_tokens": max_new_tokens},
        "releases_per_repeat": releases,
        "throughput_trials_per_repeat": trials,
        "repeat": repeat,
        "per_repeat": [{k: round(v, 6) for k, v in p.items()} for p in per],
    }


@click.command("engine", epilog=exit_codes())
@click.option("--engine", "engine_name", default="vllm", show_default=True)
@click.option("--python", default=None, help="The server's interpreter (default: build/vllm-venv).")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--prompts", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--n", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--releases", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--trials",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Generation calls per side per repetition, in ABBA order, summed.",
)
@click.option(
    "--eager/--compiled",
    default=True,
    show_default=True,
    help="--enforce-eager on the server (a CPU build's compile warm-up takes minutes).",
)
@click.option("--work-dir", type=click.Path(file_okay=False), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON object.")
def command(
    engine_name: str,
    python: Optional[str],
    repeat: int,
    prompts: int,
    n: int,
    max_new_tokens: int,
    releases: int,
    trials: int,
    eager: bool,
    work_dir: Optional[str],
    as_json: bool,
) -> None:
    """A server-backed sampler engine vs bare calls on the same server (prints JSON)."""

    def progress(msg: str) -> None:
        if not as_json:
            click.echo(f"... {msg}", err=True)

    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="yeto-bench-engine-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        out = run(
            engine_name=engine_name,
            python=python or _default_python(),
            repeat=repeat,
            prompts=prompts,
            n=n,
            max_new_tokens=max_new_tokens,
            releases=releases,
            work=work,
            progress=progress,
            eager=eager,
            trials=trials,
        )
    finally:
        if not work_dir:
            shutil.rmtree(work, ignore_errors=True)
    click.echo(json.dumps(out, sort_keys=True))
