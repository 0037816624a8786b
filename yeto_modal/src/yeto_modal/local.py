"""``python -m yeto_modal.local SPEC.json``: run one island function's body here, via ``.local()``.

``SPEC.json`` holds ``{"config": <resolved run config>, "function": "yeto-<group>",
"env": {...}}``. The app is built from the config exactly as the head builds
it, and the named function's real body runs in this process through Modal's
``Function.local()``: the way to debug an island function without a token,
and what yeto's tests run as a container.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from yeto_core.config import config_from_dict
    from yeto_core.plugins import get_plugins
    from yeto_modal.app import build, plan

    spec = json.loads(open(argv[0]).read())
    config = config_from_dict(spec["config"])
    built = build(config, plan(config, get_plugins()), config_json=spec["config"])
    if spec["function"] not in built.functions:
        print(f"no function {spec['function']!r}; the app has {sorted(built.functions)}")
        return 2
    return int(built.functions[spec["function"]].local(spec["env"]) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
