"""``python -m yeto_modal.local SPEC.json``: run one island function's body here, via ``.local()``.

``SPEC.json`` is ``{"config": <resolved run config>, "function": "yeto-<group>", "env":
{...}}``; the app is built as the head builds it (docs/modal.md, "Running an island
function's body here"). yeto's tests run every island container this way.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from yeto_core.config.load import config_from_dict
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
