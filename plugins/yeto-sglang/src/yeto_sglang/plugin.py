"""Entry point of yeto-sglang (group ``yeto``, name ``sglang``).

Registers the ``sglang`` sampler engine (an SGLang 0.5.x server over HTTP) and
a preflight that refuses server options SGLang refuses. The engine class is
imported lazily so ``yeto plugins`` stays fast.
"""

from __future__ import annotations

from pathlib import Path

from yeto_core import hookimpl


@hookimpl
def yeto_register_sampler_engines(register):
    from yeto_sglang.engine import SGLangEngine

    register(SGLangEngine)


@hookimpl
def yeto_preflight(config, report):
    from yeto_sglang.options import check_options, read_model_config, server_options_from

    for i, s in enumerate(config.samplers):
        if s.engine != "sglang":
            continue
        name = f"samplers[{i}].engine_options (sglang)"
        opts = dict(s.engine_options)
        try:
            server = server_options_from(opts.get("server"))
        except TypeError as exc:
            report.fail(name, str(exc))
            continue
        model_dir = opts.get("model_dir") or config.model.path
        model_cfg = None
        if (Path(model_dir) / "config.json").is_file():
            model_cfg = read_model_config(model_dir)
        tuning = (config.trainer.backend_options or {}).get("tuning")
        errors = check_options(
            server,
            model_config=model_cfg,
            pause_mode=opts.get("pause_mode", "abort"),
            routed_experts=bool(opts.get("routed_experts", False)),
            release_kind="lora" if tuning == "lora" else None,
        )
        if bool(opts.get("launch")) == bool(opts.get("base_url")):
            errors.append("give exactly one of base_url (attach) or launch = true (start)")
        if errors:
            report.fail(name, "; ".join(errors))
        else:
            report.ok(name, "server options accepted")
