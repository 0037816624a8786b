"""Tasks and rewards built in to the core: the ``dataset`` task (a local JSONL file) and
the ``exact``, ``regex`` and ``boxed`` rewards (docs/tasks.md). Standard library only."""
