"""``python -m yeto_core.islands.spare <entry module>``: a warm spare of the ``local``
provider (:mod:`yeto_core.providers.spare`, where the provider's side and the rules are).

It pins itself to the island's CPUs, imports the island's entry module and what the island
will use (:func:`yeto_core.islands.main.preload`), then waits for one JSON line on its
standard input: the launch's environment, working directory and log. It then becomes the
island: its output goes to the log, its input to ``/dev/null``, the environment and working
directory are the launch's, and the entry module runs as ``python -m`` would run it. The
end of its input before a launch (the provider or its head went away) ends it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Optional

from yeto_core.providers.env import pin_cpus

#: the island entry point whose preparation also imports the run's backend
ISLAND_MAIN = "yeto_core.islands.main"


def _preload(entry_module: str) -> None:
    importlib.import_module(entry_module)
    if entry_module == ISLAND_MAIN:
        from yeto_core.islands.main import preload

        preload(os.environ)


def main(argv: Optional[list[str]] = None) -> int:
    """The spare: import, wait for the launch, become the island (see the module doc)."""
    args = sys.argv[1:] if argv is None else argv
    entry = args[0] if args else ISLAND_MAIN
    try:
        pin_cpus(os.environ)  # its imports on the island's CPUs, not its neighbours'
        _preload(entry)
    except Exception as exc:  # the island itself reports what is wrong once launched
        print(f"yeto spare: preparing {entry} failed: {exc!r}", file=sys.stderr, flush=True)
    line = sys.stdin.buffer.readline()
    if not line:  # the provider went away before launching it
        return 0
    launch = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(launch["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(launch["env"])
    before = os.getcwd()
    os.chdir(launch["cwd"])
    if sys.path and sys.path[0] in (before, ""):  # ``-m`` put the working directory first
        sys.path[0] = launch["cwd"]
    sys.argv = [entry]
    if entry == ISLAND_MAIN:  # imported already: its main, not a second copy as __main__
        from yeto_core.islands.main import main as island_main

        return island_main()
    import runpy
    import warnings

    with warnings.catch_warnings():  # "found in sys.modules": imported on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        runpy.run_module(entry, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
