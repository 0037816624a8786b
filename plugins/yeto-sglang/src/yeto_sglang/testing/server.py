"""A protocol test server that stands in for SGLang 0.5.23 on 127.0.0.1.

It answers the routes the ``sglang`` engine uses with the shapes of the
responses recorded from a real SGLang 0.5.23 server (``recorded/``), with
values computed by a real model in ``transformers`` (float32), so log-probs,
tokens and routed experts are meaningful:

- ``POST /generate``: SGLang's sampling semantics (``sampler.py``): a token is
  drawn from ``softmax(logits / T)`` restricted jointly to the top-k and the
  top-p nucleus, and the returned log-prob is ``log_softmax(logits / T)``
  *before* those filters; temperature 0 is top-k 1 at T 1; prompt log-probs
  (``logprob_start_len`` >= 0) are raw. ``weight_version`` / ``weight_versions``
  record which weights served each output token; ``routed_experts`` (with
  ``--enable-return-routed-experts`` and a MoE model) is base64 int32 of the
  router's top-k per token, shape ``(tokens - 1, layers, top_k)``.
- ``/update_weights_from_disk`` loads the weights of a directory (the served
  config is kept, as SGLang does); a failed load keeps the previous weights.
- ``/load_lora_adapter`` / ``/unload_lora_adapter`` serve PEFT adapters merged
  into a copy of the base; rank and target modules are checked against the
  server flags.
- ``/pause_generation`` (``abort``: running requests finish with
  ``finish_reason.type = "abort"``; ``retract`` / ``in_place``: they wait and go
  on with the weights loaded meanwhile) and ``/continue_generation``; new
  requests wait while paused. A reload that is not paused waits for running
  requests, as SGLang's writer lock does; ``flush_cache`` while requests are
  paused ``in_place`` is SGLang's scheduler assertion: recorded as a violation
  and answered 500.

Every request body is checked against the 0.5.23 field names; anything else is
answered 400 and recorded in :attr:`ProtocolServer.violations`. Failures are
injected with :meth:`ProtocolServer.inject` (or ``POST /_yeto/inject``):
``success_false``, ``http_500``, ``drop_before`` (the connection is closed
without an answer, nothing changed) and ``drop_after`` (the change is made,
then the connection is closed).

Run it as SGLang is run (the same flags the engine passes)::

    python -m yeto_sglang.testing.server --model-path DIR --tokenizer-path DIR --port P
"""

from __future__ import annotations

import argparse
import copy
import json
import socket
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

import torch

from yeto_sglang import protocol as P

RECORDED = Path(__file__).parent / "recorded"
WAIT_S = 120.0


def recorded(name: str) -> Any:
    return json.loads((RECORDED / name).read_text())


class BadRequest(Exception):
    pass


class _Dropped(Exception):
    pass


def _load_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


class ProtocolServer:
    """The server state and its HTTP front (``start()`` / ``stop()``; ``url``)."""

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer_path: Optional[str] = None,
        host: str = "127.0.0.1",
        port: int = 0,
        enable_lora: bool = False,
        max_lora_rank: Optional[int] = None,
        lora_target_modules: Sequence[str] = (),
        max_loras_per_batch: int = 8,
        max_loaded_loras: Optional[int] = None,
        enable_return_routed_experts: bool = False,
        enable_fp32_lm_head: bool = False,
        enable_deterministic_inference: bool = False,
        tp_size: int = 1,
        mem_fraction_static: Optional[float] = None,
        weight_version: str = P.DEFAULT_WEIGHT_VERSION,
        random_seed: int = 0,
        server_args: Optional[dict[str, Any]] = None,
        step_delay_s: float = 0.0,
    ) -> None:
        from tokenizers import Tokenizer
        from transformers import AutoModelForCausalLM

        if host != "127.0.0.1":
            raise ValueError("the protocol test server binds 127.0.0.1 only")
        self.model_path = str(Path(model_path).absolute())
        self.tokenizer_path = str(Path(tokenizer_path or model_path).absolute())
        self.tokenizer = Tokenizer.from_file(str(Path(self.tokenizer_path) / "tokenizer.json"))
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=torch.float32, local_files_only=True
        ).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.config = self.model.config
        self.base_weights = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        self.adapters: dict[str, tuple[str, torch.nn.Module]] = {}
        self.enable_lora = enable_lora
        self.max_lora_rank = max_lora_rank
        self.lora_target_modules = tuple(lora_target_modules)
        self.max_loras_per_batch = max_loras_per_batch
        self.max_loaded_loras = max_loaded_loras
        self.enable_return_routed_experts = enable_return_routed_experts
        self.enable_deterministic_inference = enable_deterministic_inference
        self.weight_version = weight_version
        self.info = recorded("server_info.json")
        self.info.update(
            {
                "model_path": self.model_path,
                "served_model_name": self.model_path,
                "tokenizer_path": self.tokenizer_path,
                "host": host,
                "enable_lora": True if enable_lora else None,
                "max_lora_rank": max_lora_rank,
                "lora_target_modules": list(lora_target_modules) or None,
                "max_loras_per_batch": max_loras_per_batch,
                "max_loaded_loras": max_loaded_loras,
                "enable_return_routed_experts": enable_return_routed_experts,
                "enable_fp32_lm_head": enable_fp32_lm_head,
                "enable_deterministic_inference": enable_deterministic_inference,
                "tp_size": tp_size,
                "weight_version": weight_version,
                "random_seed": random_seed,
                **(server_args or {}),
            }
        )
        if mem_fraction_static is not None:
            self.info["mem_fraction_static"] = mem_fraction_static
        self.eos = (
            {int(self.config.eos_token_id)} if self.config.eos_token_id is not None else set()
        )
        self.gen = torch.Generator().manual_seed(int(random_seed))
        self.model_lock = threading.RLock()
        self.cond = threading.Condition()
        self.paused: Optional[str] = None
        self.active = 0
        self.in_place_waiting = 0
        self.step_delay_s = float(step_delay_s)
        self.steps = 0
        self.violations: list[str] = []
        self.log: list[tuple[str, Any]] = []
        self._inject: dict[str, list[str]] = {}
        self._httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._host, self._port = host, port

    # -- lifecycle --------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start() the server first"
        return f"http://{self._host}:{self._httpd.server_address[1]}"

    def start(self) -> ProtocolServer:
        server = self

        class Handler(_Handler):
            state = server

        self._httpd = ThreadingHTTPServer((self._host, self._port), Handler)
        self._httpd.daemon_threads = True
        self.info["port"] = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.start()
        assert self._thread is not None
        self._thread.join()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ProtocolServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- failure injection ------------------------------------------------------------

    def inject(self, route: str, kind: str, times: int = 1) -> None:
        """Answer the next ``times`` requests to ``route`` with failure ``kind``."""
        kinds = ("success_false", "http_500", "drop_before", "drop_after")
        if kind not in kinds:
            raise ValueError(f"inject kind {kind!r}; one of {kinds}")
        with self.cond:
            self._inject.setdefault(route, []).extend([kind] * times)

    def take_injection(self, route: str) -> Optional[str]:
        with self.cond:
            queue = self._inject.get(route)
            return queue.pop(0) if queue else None

    def wait_for_steps(self, n: int, timeout_s: float = 60.0) -> None:
        """Block until ``n`` decode steps ran in total (a request is in flight)."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.steps >= n, timeout_s):
                raise TimeoutError(f"only {self.steps} decode steps after {timeout_s} s")

    def violation(self, text: str) -> None:
        with self.cond:
            self.violations.append(text)

    # -- model helpers ----------------------------------------------------------------

    def _model_for(self, lora: Optional[str]) -> torch.nn.Module:
        if lora is None:
            return self.model
        return self.adapters[lora][1]

    @torch.no_grad()
    def _last_logits(self, model: torch.nn.Module, seqs: list[list[int]]) -> torch.Tensor:
        """Next-token logits of each sequence (right padding; causal attention)."""
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
        logits = model(input_ids=ids).logits.float()
        last = torch.tensor([len(s) - 1 for s in seqs])
        return logits[torch.arange(len(seqs)), last]

    @torch.no_grad()
    def _prompt_logprobs(self, model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
        logits = model(input_ids=torch.tensor([ids])).logits.float()[0]
        return torch.log_softmax(logits, dim=-1)

    @torch.no_grad()
    def _routed(self, model: torch.nn.Module, ids: list[int]) -> Any:
        import numpy as np

        k = int(self.config.num_experts_per_tok)
        out = model(input_ids=torch.tensor([ids[:-1]]), output_router_logits=True)
        rows = []
        for layer in out.router_logits:
            probs = torch.softmax(layer.float().reshape(len(ids) - 1, -1), dim=-1)
            rows.append(torch.topk(probs, k, dim=-1).indices)
        return np.stack([r.numpy() for r in rows], axis=1).astype(np.int32)

    # -- routes -----------------------------------------------------------------------

    def generate(self, body: dict[str, Any]) -> Any:
        bad = P.unknown_fields(body, P.GENERATE_FIELDS)
        if bad:
            raise BadRequest(f"unknown GenerateReqInput fields {bad}")
        ids = body.get("input_ids")
        if ids is None or body.get("text") is not None:
            raise BadRequest("the protocol server takes input_ids only")
        single = bool(ids) and isinstance(ids[0], int)
        batch = [list(ids)] if single else [list(x) for x in ids]
        if not batch or any(not x or not all(isinstance(t, int) for t in x) for x in batch):
            raise BadRequest("input_ids must be a non-empty list of token ids (or of such lists)")
        n = len(batch)

        def per(name: str, default: Any) -> list[Any]:
            v = body.get(name, default)
            if isinstance(v, list) and not single and name != "token_ids_logprob":
                if len(v) != n:
                    raise BadRequest(f"{name} has {len(v)} entries for {n} inputs")
                return v
            return [v] * n

        sps = per("sampling_params", {})
        params = [self._sampling(sp or {}) for sp in sps]
        loras = per("lora_path", None)
        for name in loras:
            if name is not None and name not in self.adapters:
                raise BadRequest(
                    f"The following requested LoRA adapters are not loaded: {name}\n"
                    f"Loaded adapters: {sorted(self.adapters)}"
                )
        want_lp = per("return_logprob", False)
        starts = per("logprob_start_len", -1)
        tops = per("top_logprobs_num", 0)
        routed = per("return_routed_experts", False)
        if any(routed) and not self.enable_return_routed_experts:
            raise BadRequest(
                "return_routed_experts needs the server started with --enable-return-routed-experts"
            )
        rids = per("rid", None)
        with self.cond:
            if not self.cond.wait_for(lambda: self.paused is None, WAIT_S):
                raise TimeoutError("paused for too long")
            self.active += 1
        try:
            outs = self._run(batch, params, loras)
        finally:
            with self.cond:
                self.active -= 1
                self.cond.notify_all()
        answers = []
        for i, o in enumerate(outs):
            answers.append(
                self._answer(
                    batch[i],
                    o,
                    params[i],
                    loras[i],
                    want_lp[i],
                    starts[i],
                    tops[i],
                    routed[i],
                    rids[i],
                )
            )
        return answers[0] if single else answers

    def _sampling(self, sp: dict[str, Any]) -> dict[str, Any]:
        bad = P.unknown_fields(sp, P.SAMPLING_FIELDS)
        if bad:
            raise BadRequest(f"unknown SamplingParams fields {bad}")
        t = float(sp.get("temperature", 1.0) if sp.get("temperature") is not None else 1.0)
        top_k = int(sp.get("top_k", -1) if sp.get("top_k") is not None else -1)
        top_p = float(sp.get("top_p", 1.0) if sp.get("top_p") is not None else 1.0)
        if t < 0:
            raise BadRequest(f"temperature must be a non-negative finite number, got {t}.")
        if not 0.0 < top_p <= 1.0:
            raise BadRequest(f"top_p must be in (0, 1], got {top_p}.")
        if 0 <= t < P.SAMPLING_EPS:
            t, top_k = 1.0, 1
        if top_k == -1:
            top_k = P.TOP_K_ALL
        if top_k < 1:
            raise BadRequest(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
        if float(sp.get("min_p", 0.0) or 0.0) != 0.0:
            raise BadRequest("the protocol server does not sample with min_p")
        stop = {int(x) for x in (sp.get("stop_token_ids") or ())}
        seed = sp.get("sampling_seed")
        return {
            "temperature": t,
            "top_k": top_k,
            "top_p": top_p,
            "max_new_tokens": int(sp.get("max_new_tokens", 128)),
            "stop": stop | (set() if sp.get("ignore_eos") else self.eos),
            "seed": None if seed is None else int(seed),
        }

    def _run(
        self, batch: list[list[int]], params: list[dict[str, Any]], loras: list[Optional[str]]
    ) -> list[dict[str, Any]]:
        seqs = [
            {
                "ids": list(b),
                "out": [],
                "lps": [],
                "all": [],
                "spans": [],
                "finish": None,
                "retractions": 0,
                "gen": torch.Generator().manual_seed(p["seed"]) if p["seed"] is not None else None,
            }
            for b, p in zip(batch, params, strict=True)
        ]
        for k, s in enumerate(seqs):
            if params[k]["max_new_tokens"] == 0:
                s["finish"] = {"type": "length", "length": 0}
        while True:
            live = [k for k, s in enumerate(seqs) if s["finish"] is None]
            if not live:
                return seqs
            with self.cond:
                if self.paused == "abort":
                    for k in live:
                        seqs[k]["finish"] = {
                            "type": "abort",
                            "message": "Abort by pause_generation (mode abort).",
                            "status_code": 200,
                            "err_type": None,
                        }
                    continue
                if self.paused is not None:
                    mode = self.paused
                    if mode == "in_place":
                        self.in_place_waiting += 1
                    try:
                        if not self.cond.wait_for(lambda: self.paused is None, WAIT_S):
                            raise TimeoutError("paused for too long")
                    finally:
                        if mode == "in_place":
                            self.in_place_waiting -= 1
                    if mode == "retract":
                        for k in live:
                            seqs[k]["retractions"] += 1
                    continue
            with self.model_lock:
                version = self.weight_version
                groups: dict[Optional[str], list[int]] = {}
                for k in live:
                    groups.setdefault(loras[k], []).append(k)
                for lora, ks in groups.items():
                    model = self._model_for(lora)
                    logits = self._last_logits(model, [seqs[k]["ids"] for k in ks])
                    for row, k in enumerate(ks):
                        self._step(seqs[k], params[k], logits[row], version)
            with self.cond:
                self.steps += 1
                self.cond.notify_all()
            if self.step_delay_s:
                time.sleep(self.step_delay_s)

    def _step(
        self, s: dict[str, Any], p: dict[str, Any], logits: torch.Tensor, version: str
    ) -> None:
        x = logits / p["temperature"]
        lp_all = torch.log_softmax(x, dim=-1)
        probs = lp_all.exp()
        sorted_p, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_p, 0) - sorted_p
        keep = (torch.arange(len(sorted_p)) < p["top_k"]) & (before <= p["top_p"])
        q = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
        gen = s["gen"] if s["gen"] is not None else self.gen
        pick = int(torch.multinomial(q / q.sum(), 1, generator=gen))
        tok = int(order[pick])
        idx = len(s["out"])
        s["out"].append(tok)
        s["ids"].append(tok)
        s["lps"].append(float(lp_all[tok]))
        s["all"].append(lp_all)
        spans = s["spans"]
        if spans and spans[-1][0] == version:
            spans[-1][2] = idx + 1
        else:
            spans.append([version, idx, idx + 1])
        if tok in p["stop"]:
            s["finish"] = {"type": "stop", "matched": tok}
        elif len(s["out"]) >= p["max_new_tokens"]:
            s["finish"] = {"type": "length", "length": p["max_new_tokens"]}

    def _answer(
        self,
        prompt: list[int],
        s: dict[str, Any],
        p: dict[str, Any],
        lora: Optional[str],
        want_lp: bool,
        start: int,
        top_n: int,
        routed: bool,
        rid: Optional[str],
    ) -> dict[str, Any]:
        out = s["out"]
        version = s["spans"][-1][0] if s["spans"] else self.weight_version
        meta: dict[str, Any] = {
            "id": rid or uuid.uuid4().hex,
            "finish_reason": s["finish"],
            "prompt_tokens": len(prompt),
            "weight_version": version,
            "num_retractions": s["retractions"],
        }
        model = self._model_for(lora)
        if want_lp:
            inputs, input_tops = [], []
            if start is not None and start >= 0:
                with self.model_lock:
                    plp = self._prompt_logprobs(model, prompt)
                for i in range(start, len(prompt)):
                    if i == 0:
                        inputs.append([None, prompt[0], None])
                        input_tops.append(None)
                        continue
                    row = plp[i - 1]
                    inputs.append([float(row[prompt[i]]), prompt[i], None])
                    if top_n:
                        v, ix = torch.topk(row, top_n)
                        input_tops.append(
                            [[float(a), int(b), None] for a, b in zip(v, ix, strict=True)]
                        )
            meta["input_token_logprobs"] = inputs
            meta["output_token_logprobs"] = [
                [lp, tok, None] for lp, tok in zip(s["lps"], out, strict=True)
            ]
            meta["output_token_logprobs_length"] = len(out)
            if top_n:
                meta["input_top_logprobs"] = input_tops
                tops = []
                for row in s["all"]:
                    v, ix = torch.topk(row, min(top_n, row.shape[-1]))
                    tops.append([[float(a), int(b), None] for a, b in zip(v, ix, strict=True)])
                meta["output_top_logprobs"] = tops
        meta.update(
            {
                "reasoning_tokens": 0,
                "completion_tokens": len(out),
                "cached_tokens": 0,
                "weight_versions": [{"version": v, "start": a, "end": b} for v, a, b in s["spans"]],
                "cached_tokens_details": None,
                "dp_rank": None,
                "e2e_latency": 0.0,
                "response_sent_to_client_ts": time.time(),
            }
        )
        if routed:
            with self.model_lock:
                arr = self._routed(model, prompt + out)
            meta["routed_experts"] = P.encode_routed_experts(arr)
        text = self.tokenizer.decode(out, skip_special_tokens=True)
        return {"text": text, "output_ids": list(out), "meta_info": meta}

    def update_weights_from_disk(self, body: dict[str, Any], after: Any = None) -> Any:
        bad = P.unknown_fields(body, P.UPDATE_FROM_DISK_FIELDS)
        if bad:
            raise BadRequest(f"unknown UpdateWeightFromDiskReqInput fields {bad}")
        if not body.get("model_path"):
            raise BadRequest("model_path is required")
        flush = body.get("flush_cache", True)
        with self.cond:
            if self.paused is None:
                # not paused: SGLang's writer lock waits for running requests
                if not self.cond.wait_for(lambda: self.active == 0, WAIT_S):
                    raise TimeoutError("running requests did not finish")
            if flush and self.in_place_waiting:
                self.violation(
                    "update_weights_from_disk with flush_cache=true while requests are paused "
                    "in_place: SGLang's scheduler asserts (Cache flush failed after updating "
                    "weights) and dies"
                )
                return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "Cache flush failed"}
        try:
            weights = _load_weights(Path(body["model_path"]))
            with self.model_lock:
                params = dict(self.model.named_parameters())
                missing = sorted(set(params) - set(weights))
                if missing:
                    raise ValueError(f"weights missing: {missing[:3]}")
                for name, prm in params.items():
                    if tuple(weights[name].shape) != tuple(prm.shape):
                        raise ValueError(
                            f"shape mismatch for {name}: {tuple(weights[name].shape)} vs "
                            f"{tuple(prm.shape)}"
                        )
                with torch.no_grad():
                    for name, prm in params.items():
                        prm.copy_(weights[name].to(prm.dtype))
                if body.get("weight_version") is not None:
                    self.weight_version = str(body["weight_version"])
        except (OSError, ValueError, KeyError) as exc:
            # SGLang 0.5.23: HTTP 400 with {"success": false, "message": ...}
            return HTTPStatus.BAD_REQUEST, {
                "success": False,
                "message": f"Failed to get weights iterator: {exc}.",
                "num_paused_requests": 0,
            }
        ans = recorded("update_weights_from_disk.json")
        ans["message"] = (
            f"Succeeded to update model weights. Weight version updated to {self.weight_version}."
        )
        return ans

    def load_lora_adapter(self, body: dict[str, Any]) -> Any:
        bad = P.unknown_fields(body, P.LOAD_LORA_FIELDS)
        if bad:
            raise BadRequest(f"unknown LoadLoRAAdapterReqInput fields {bad}")
        name, path = body.get("lora_name"), body.get("lora_path")
        ans = recorded("load_lora_adapter.json")
        if not self.enable_lora:
            raise BadRequest("LoRA is not enabled: start the server with --enable-lora")
        err = None
        try:
            cfg = json.loads((Path(path) / "adapter_config.json").read_text())
            if name in self.adapters:
                err = f"LoRA adapter with name {name} already exists."
            elif self.max_lora_rank is not None and int(cfg["r"]) > self.max_lora_rank:
                err = (
                    f"LoRA adapter {name} with rank {cfg['r']} is incompatible with the current "
                    f"LoRA memory pool configuration (max_lora_rank {self.max_lora_rank})."
                )
            elif "all" not in self.lora_target_modules and not set(cfg["target_modules"]) <= set(
                self.lora_target_modules
            ):
                err = (
                    f"LoRA adapter {name} targets {cfg['target_modules']}, not in "
                    f"--lora-target-modules {list(self.lora_target_modules)}."
                )
            elif self.max_loaded_loras is not None and len(self.adapters) >= self.max_loaded_loras:
                err = f"Maximum number of loaded LoRA adapters ({self.max_loaded_loras}) reached."
            else:
                self.adapters[name] = (str(path), self._merged(Path(path), cfg))
        except (OSError, ValueError, KeyError) as exc:
            err = f"Failed to load LoRA adapter {name}: {exc}"
        ans["success"] = err is None
        ans["error_message"] = err or ""
        ans["loaded_adapters"] = {k: v[0] for k, v in self.adapters.items()}
        return ans if err is None else (HTTPStatus.BAD_REQUEST, ans)

    def _merged(self, path: Path, cfg: dict[str, Any]) -> torch.nn.Module:
        from safetensors.torch import load_file

        tensors = load_file(str(path / "adapter_model.safetensors"))
        scale = float(cfg["lora_alpha"]) / int(cfg["r"])
        with self.model_lock:
            model = copy.deepcopy(self.model)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for key, a in tensors.items():
                if not key.endswith(".lora_A.weight"):
                    continue
                mod = key[len("base_model.model.") : -len(".lora_A.weight")]
                b = tensors[key.replace(".lora_A.", ".lora_B.")]
                w = params[f"{mod}.weight"]
                w.copy_(w + (b.float() @ a.float()) * scale)
        return model.eval()

    def unload_lora_adapter(self, body: dict[str, Any]) -> Any:
        bad = P.unknown_fields(body, P.UNLOAD_LORA_FIELDS)
        if bad:
            raise BadRequest(f"unknown UnloadLoRAAdapterReqInput fields {bad}")
        name = body.get("lora_name")
        ans = recorded("unload_lora_adapter.json")
        if name not in self.adapters:
            ans["success"] = False
            ans["error_message"] = f"LoRA adapter {name} is not loaded."
        else:
            del self.adapters[name]
        ans["loaded_adapters"] = {k: v[0] for k, v in self.adapters.items()}
        return ans if ans["success"] else (HTTPStatus.BAD_REQUEST, ans)

    def pause(self, body: dict[str, Any]) -> Any:
        bad = P.unknown_fields(body, P.PAUSE_FIELDS)
        mode = body.get("mode", "abort")
        if bad or mode not in P.PAUSE_MODES:
            raise BadRequest(f"pause_generation takes mode in {P.PAUSE_MODES}; got {body}")
        with self.cond:
            self.paused = mode
            self.cond.notify_all()
        return {"message": "Generation paused successfully.", "status": "ok"}

    def resume(self, body: dict[str, Any]) -> Any:
        with self.cond:
            self.paused = None
            self.cond.notify_all()
        return {"message": "Generation continued successfully.", "status": "ok"}

    def flush_cache(self) -> tuple[int, str]:
        with self.cond:
            busy = self.active > 0
        if busy:
            return HTTPStatus.BAD_REQUEST, (
                "Cache not flushed. Please check backend logs for more details. (When there are "
                "running or waiting requests, the operation will not be performed.)\n"
            )
        return HTTPStatus.OK, (
            "Cache flushed.\nPlease check backend logs for more details. (When there are running "
            "or waiting requests, the operation will not be performed.)\n"
        )

    def model_info(self) -> Any:
        ans = recorded("model_info.json")
        ans.update(
            {
                "model_path": self.model_path,
                "served_model_name": self.model_path,
                "tokenizer_path": self.tokenizer_path,
                "weight_version": self.weight_version,
                "model_type": getattr(self.config, "model_type", ans["model_type"]),
                "architectures": list(getattr(self.config, "architectures", None) or []),
            }
        )
        return ans


class _Handler(BaseHTTPRequestHandler):
    state: ProtocolServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, status: int, payload: Any) -> None:
        if isinstance(payload, (dict, list)):
            data = json.dumps(payload).encode()
            ctype = "application/json"
        else:
            data = str(payload).encode()
            ctype = "text/plain; charset=utf-8"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        raise _Dropped()

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise BadRequest("the request body must be a JSON object")
        return data

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        st = self.state
        route = self.path.split("?", 1)[0]
        try:
            body = self._body() if method == "POST" else {}
            st.log.append((route, body))
            injected = st.take_injection(route)
            if injected == "drop_before":
                self._drop()
            if injected == "http_500":
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": {"message": "injected"}})
                return
            if injected == "success_false":
                self._send(
                    HTTPStatus.BAD_REQUEST,  # SGLang 0.5.23 answers a refusal with 400
                    {
                        "success": False,
                        "message": "injected failure",
                        "error_message": "injected failure",
                        "num_paused_requests": 0,
                        "loaded_adapters": {k: v[0] for k, v in st.adapters.items()},
                    },
                )
                return
            result = self._route(method, route, body)
            if injected == "drop_after":
                self._drop()
            if isinstance(result, tuple):
                self._send(result[0], result[1])
            else:
                self._send(HTTPStatus.OK, result)
        except _Dropped:
            return
        except BadRequest as exc:
            st.violation(f"{route}: {exc}")
            self._send(HTTPStatus.BAD_REQUEST, {"error": {"message": str(exc)}})
        except json.JSONDecodeError as exc:
            st.violation(f"{route}: body is not JSON ({exc})")
            self._send(HTTPStatus.BAD_REQUEST, {"error": {"message": str(exc)}})
        except Exception as exc:  # an internal error answers 500, as a server would
            self._send(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                {"error": {"message": f"{type(exc).__name__}: {exc}"}},
            )

    def _route(self, method: str, route: str, body: dict[str, Any]) -> Any:
        st = self.state
        if route in ("/health", "/health_generate") and method == "GET":
            return (HTTPStatus.OK, "")
        if route in ("/model_info", "/get_model_info") and method == "GET":
            return st.model_info()
        if route in ("/server_info", "/get_server_info") and method == "GET":
            return st.info
        if route == "/flush_cache":
            return st.flush_cache()
        if route == "/_yeto/inject" and method == "POST":
            st.inject(body["route"], body["kind"], int(body.get("times", 1)))
            return {"ok": True}
        if route == "/_yeto/state" and method == "GET":
            return {"violations": st.violations, "weight_version": st.weight_version}
        if method != "POST":
            return (HTTPStatus.NOT_FOUND, {"detail": "Not Found"})
        handlers = {
            "/generate": st.generate,
            "/update_weights_from_disk": st.update_weights_from_disk,
            "/load_lora_adapter": st.load_lora_adapter,
            "/unload_lora_adapter": st.unload_lora_adapter,
            "/pause_generation": st.pause,
            "/continue_generation": st.resume,
        }
        if route not in handlers:
            return (HTTPStatus.NOT_FOUND, {"detail": "Not Found"})
        return handlers[route](body)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m yeto_sglang.testing.server",
        description="SGLang 0.5.23 protocol test server (a transformers model behind SGLang's routes)",
    )
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--tokenizer-path")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--weight-version", default=P.DEFAULT_WEIGHT_VERSION)
    ap.add_argument("--mem-fraction-static", type=float)
    ap.add_argument("--enable-fp32-lm-head", action="store_true")
    ap.add_argument("--enable-return-routed-experts", action="store_true")
    ap.add_argument("--enable-lora", action="store_true")
    ap.add_argument("--max-lora-rank", type=int)
    ap.add_argument("--lora-target-modules", nargs="+", default=[])
    ap.add_argument("--max-loras-per-batch", type=int, default=8)
    ap.add_argument("--max-loaded-loras", type=int)
    ap.add_argument("--lora-backend")
    ap.add_argument("--dtype")
    ap.add_argument("--device")
    ap.add_argument("--attention-backend")
    ap.add_argument("--random-seed", type=int, default=0)
    ap.add_argument("--enable-deterministic-inference", action="store_true")
    ap.add_argument("--skip-server-warmup", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (protocol server only)")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    args = _parser().parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    server = ProtocolServer(
        args.model_path,
        tokenizer_path=args.tokenizer_path,
        host=args.host,
        port=args.port,
        enable_lora=args.enable_lora,
        max_lora_rank=args.max_lora_rank,
        lora_target_modules=args.lora_target_modules,
        max_loras_per_batch=args.max_loras_per_batch,
        max_loaded_loras=args.max_loaded_loras,
        enable_return_routed_experts=args.enable_return_routed_experts,
        enable_fp32_lm_head=args.enable_fp32_lm_head,
        enable_deterministic_inference=args.enable_deterministic_inference,
        tp_size=args.tp_size,
        mem_fraction_static=args.mem_fraction_static,
        weight_version=args.weight_version,
        random_seed=args.random_seed,
        server_args={"lora_backend": args.lora_backend} if args.lora_backend else None,
    )
    print(
        f"protocol server serving {args.model_path} at http://{args.host}:{args.port}", flush=True
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
