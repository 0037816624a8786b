"""``[sandbox]``: the sandbox host where the tools and trials of agentic rollouts run.

``host`` names a :class:`~yeto_core.ports.SandboxHost` (built-in ``bwrap`` and
``docker``; ``modal`` with yeto-modal; ``""``: no sandbox); ``options`` reach it;
``cpu_s``, ``memory_mb`` and ``wall_s`` are the limits of each command; ``state_dir``
is where a host on the island's machine keeps its labels (default: the system's
temporary directory, ``yeto-sandboxes``). docs/agentic.md, "Sandbox hosts".
"""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path
from typing import Any

import attrs

_HOST_RE = re.compile(r"^[a-z][a-z0-9_-]{0,40}$")
#: the longest any one limit may be (a day)
MAX_SECONDS = 86400.0
MAX_MEMORY_MB = 1 << 20


@attrs.frozen
class SandboxConfig:
    """``[sandbox]``: the host, its options, and each command's limits."""

    host: str = ""
    options: dict[str, Any] = attrs.field(factory=dict)
    cpu_s: float = 10.0
    memory_mb: int = 512
    wall_s: float = 30.0
    state_dir: str = ""
    #: a sampler island removes what its predecessors left when it starts
    sweep_at_start: bool = True
    #: while its start sweep kept a running predecessor's sandboxes, the island sweeps
    #: again this often until that predecessor has left or is fenced
    sweep_again_s: float = 30.0

    def state_path(self) -> Path:
        return Path(self.state_dir or Path(tempfile.gettempdir()) / "yeto-sandboxes")


def validate_sandbox(s: SandboxConfig, errors: list[str], path: str = "sandbox") -> None:
    """Append an error naming the TOML path of every bad ``[sandbox]`` value."""
    if not isinstance(s.host, str) or (s.host and not _HOST_RE.match(s.host)):
        errors.append(
            f"{path}.host = {s.host!r}; name a sandbox host (bwrap, docker, modal, or a "
            "plugin's; `yeto plugins` lists them) or leave it out for none"
        )
    for name in ("cpu_s", "wall_s", "sweep_again_s"):
        v = getattr(s, name)
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or not math.isfinite(v)
            or not (0 < v <= MAX_SECONDS)
        ):
            errors.append(f"{path}.{name} = {v!r}; it must be a number of seconds in (0, 86400]")
    m = s.memory_mb
    if isinstance(m, bool) or not isinstance(m, int) or not 16 <= m <= MAX_MEMORY_MB:
        errors.append(f"{path}.memory_mb = {m!r}; it must be an integer in [16, {MAX_MEMORY_MB}]")
    if not isinstance(s.sweep_at_start, bool):
        errors.append(f"{path}.sweep_at_start = {s.sweep_at_start!r}; it must be true or false")
    if s.options and not s.host:
        errors.append(f"{path}.options is set but {path}.host is empty; name the host")
