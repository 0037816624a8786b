"""The SGLang server a sampler island starts: its options, command line and preflight.

:class:`ServerOptions` holds the flags users need (``--enable-fp32-lm-head``,
``--enable-return-routed-experts``, the LoRA flags, ``--mem-fraction-static``,
``--tp-size``, ...). :func:`check_options` refuses the combinations SGLang
0.5.23 refuses at start-up (``ServerArgs.check_server_args`` /
``check_lora_server_args``) and those this engine cannot serve correctly, each
with what to change. :func:`server_args` is the command line; the server is
always started with ``--tokenizer-path`` = the base model, so a release is
served with the tokenizer the prompts were encoded with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import attrs

from yeto_sglang.protocol import PAUSE_MODES

#: LoRA target modules SGLang 0.5.x accepts in ``--lora-target-modules``.
LORA_TARGET_MODULES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "qkv_proj",
    "gate_up_proj",
    "all",
)


@attrs.frozen
class ServerOptions:
    """Flags of ``python -m sglang.launch_server`` that yeto sets (see docs/sglang.md)."""

    tp_size: int = 1
    mem_fraction_static: Optional[float] = None
    enable_fp32_lm_head: bool = False
    enable_return_routed_experts: bool = False
    enable_lora: bool = False
    max_lora_rank: Optional[int] = None
    lora_target_modules: tuple[str, ...] = ()
    max_loras_per_batch: int = 8
    max_loaded_loras: Optional[int] = None
    lora_backend: Optional[str] = None
    dtype: Optional[str] = None
    device: Optional[str] = None
    attention_backend: Optional[str] = None
    enable_deterministic_inference: bool = False
    skip_server_warmup: bool = False
    random_seed: Optional[int] = None
    #: Extra flags appended verbatim (checked by SGLang itself, not here).
    extra_args: tuple[str, ...] = ()


def check_options(
    opts: ServerOptions,
    *,
    model_config: Optional[dict[str, Any]] = None,
    pause_mode: Optional[str] = None,
    routed_experts: bool = False,
    release_kind: Optional[str] = None,
) -> list[str]:
    """What SGLang (or this engine) refuses in ``opts``; each line says what to change.

    :param model_config: the base's ``config.json`` (head counts for ``tp_size``, MoE keys).
    :param routed_experts: whether samples must carry routed experts.
    :param release_kind: ``"full"`` or ``"lora"`` when known (the trainer's tuning).
    """
    errors: list[str] = []
    p = "engine_options.server"
    if opts.tp_size < 1:
        errors.append(f"{p}.tp_size = {opts.tp_size}; it must be >= 1")
    if opts.mem_fraction_static is not None and not 0.0 < opts.mem_fraction_static < 1.0:
        errors.append(
            f"{p}.mem_fraction_static = {opts.mem_fraction_static}; SGLang needs a fraction "
            "of device memory in (0, 1), e.g. 0.8"
        )
    if opts.max_loras_per_batch <= 0:
        errors.append(
            f"{p}.max_loras_per_batch = {opts.max_loras_per_batch}; SGLang refuses it "
            "(max_loras_per_batch must be positive)"
        )
    if opts.enable_lora:
        if not (opts.max_lora_rank and opts.lora_target_modules):
            errors.append(
                f"{p}.enable_lora is set without max_lora_rank and lora_target_modules; SGLang "
                "refuses it when no initial --lora-paths are given (yeto loads adapters at run "
                "time). Set both, e.g. max_lora_rank = 8, lora_target_modules = "
                '["q_proj", "v_proj"]'
            )
        bad = [m for m in opts.lora_target_modules if m not in LORA_TARGET_MODULES]
        if bad:
            errors.append(
                f"{p}.lora_target_modules has {bad}; SGLang accepts "
                f"{', '.join(LORA_TARGET_MODULES)}"
            )
        if "all" in opts.lora_target_modules and len(opts.lora_target_modules) > 1:
            errors.append(
                f"{p}.lora_target_modules = {list(opts.lora_target_modules)}; SGLang refuses "
                "'all' together with other modules"
            )
        if opts.max_loaded_loras is not None:
            if opts.max_loaded_loras < opts.max_loras_per_batch:
                errors.append(
                    f"{p}.max_loaded_loras = {opts.max_loaded_loras} < max_loras_per_batch = "
                    f"{opts.max_loras_per_batch}; SGLang refuses it (max_loaded_loras must be "
                    ">= max_loras_per_batch)"
                )
            if opts.max_loaded_loras < 2:
                errors.append(
                    f"{p}.max_loaded_loras = {opts.max_loaded_loras}; yeto keeps the previous "
                    "adapter loaded until the next one is verified, so it needs at least 2"
                )
    elif opts.max_lora_rank or opts.lora_target_modules or opts.max_loaded_loras:
        errors.append(
            f"{p}: max_lora_rank / lora_target_modules / max_loaded_loras are set but "
            "enable_lora is not; set enable_lora = true or drop them"
        )
    if release_kind == "lora" and not opts.enable_lora:
        errors.append(
            f"the trainer publishes LoRA releases but {p}.enable_lora is false; SGLang serves "
            "adapters only when started with --enable-lora"
        )
    if routed_experts and not opts.enable_return_routed_experts:
        errors.append(
            "engine_options.routed_experts = true needs "
            f"{p}.enable_return_routed_experts = true (--enable-return-routed-experts)"
        )
    if pause_mode is not None and pause_mode not in PAUSE_MODES:
        errors.append(
            f"engine_options.pause_mode = {pause_mode!r}; SGLang's /pause_generation takes "
            f"{', '.join(PAUSE_MODES)} (or leave it unset: a reload then waits for "
            "running requests)"
        )
    if model_config is not None:
        heads = model_config.get("num_attention_heads")
        if heads and opts.tp_size >= 1 and heads % opts.tp_size:
            errors.append(
                f"{p}.tp_size = {opts.tp_size} does not divide the model's "
                f"num_attention_heads = {heads}; SGLang cannot shard the attention"
            )
        kv = model_config.get("num_key_value_heads") or heads
        if kv and opts.tp_size >= 1 and kv % opts.tp_size and opts.tp_size % kv:
            errors.append(
                f"{p}.tp_size = {opts.tp_size} and num_key_value_heads = {kv}: one must "
                "divide the other for SGLang to shard (or replicate) the KV heads"
            )
        if routed_experts and moe_shape(model_config) is None:
            errors.append(
                "engine_options.routed_experts = true, but the base model routes no experts "
                "(its config.json has no num_local_experts / num_experts and "
                "num_experts_per_tok)"
            )
    return errors


def moe_shape(model_config: dict[str, Any]) -> Optional[tuple[int, int, int]]:
    """``(moe layers, top_k, experts)`` of a MoE config; None for a dense model."""
    experts = model_config.get("num_local_experts") or model_config.get("num_experts")
    top_k = model_config.get("num_experts_per_tok")
    if not experts or not top_k:
        return None
    return int(model_config["num_hidden_layers"]), int(top_k), int(experts)


def read_model_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise FileNotFoundError(
            f"cannot read {path}: {exc.strerror}; model_dir must be a Hugging Face checkpoint"
        ) from None


def server_args(
    opts: ServerOptions, *, model_dir: str, host: str, port: int | str, weight_version: str
) -> list[str]:
    """The ``sglang.launch_server`` arguments (tokenizer = the base, always)."""
    base = str(Path(model_dir).absolute())
    args = [
        "--model-path",
        base,
        "--tokenizer-path",
        base,
        "--host",
        host,
        "--port",
        str(port),
        "--tp-size",
        str(opts.tp_size),
        "--weight-version",
        weight_version,
    ]
    if opts.mem_fraction_static is not None:
        args += ["--mem-fraction-static", repr(float(opts.mem_fraction_static))]
    if opts.enable_fp32_lm_head:
        args.append("--enable-fp32-lm-head")
    if opts.enable_return_routed_experts:
        args.append("--enable-return-routed-experts")
    if opts.enable_lora:
        args += ["--enable-lora", "--max-lora-rank", str(opts.max_lora_rank)]
        args += ["--lora-target-modules", *opts.lora_target_modules]
        args += ["--max-loras-per-batch", str(opts.max_loras_per_batch)]
        if opts.max_loaded_loras is not None:
            args += ["--max-loaded-loras", str(opts.max_loaded_loras)]
        if opts.lora_backend:
            args += ["--lora-backend", opts.lora_backend]
    for flag, value in (
        ("--dtype", opts.dtype),
        ("--device", opts.device),
        ("--attention-backend", opts.attention_backend),
        ("--random-seed", opts.random_seed),
    ):
        if value is not None:
            args += [flag, str(value)]
    if opts.enable_deterministic_inference:
        args.append("--enable-deterministic-inference")
    if opts.skip_server_warmup:
        args.append("--skip-server-warmup")
    return args + list(opts.extra_args)


def server_options_from(data: Any) -> ServerOptions:
    """Build :class:`ServerOptions` from the ``server`` table of ``engine_options``."""
    if data is None:
        return ServerOptions()
    if isinstance(data, ServerOptions):
        return data
    if not isinstance(data, dict):
        raise TypeError(f"engine_options.server must be a table, got {type(data).__name__}")
    names = {f.name for f in attrs.fields(ServerOptions)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise TypeError(
            f"engine_options.server: unknown keys {unknown}; allowed: {', '.join(sorted(names))}"
        )
    kw = dict(data)
    for key in ("lora_target_modules", "extra_args"):
        if key in kw:
            value = kw[key]
            kw[key] = tuple([value] if isinstance(value, str) else value)
    return ServerOptions(**kw)
