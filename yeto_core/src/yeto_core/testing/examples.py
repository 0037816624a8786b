"""The docstring examples of :mod:`yeto_core.ports` as importable plugin modules (tests)."""

from __future__ import annotations

import inspect
import types

from yeto_core import ports


def example_source(port: type[ports.Port]) -> str:
    """The code block after ``Complete plugin ...::`` in ``port``'s docstring."""
    doc = inspect.getdoc(port) or ""
    if "Complete plugin" not in doc:
        raise AssertionError(f"{port.__name__}'s docstring has no 'Complete plugin' example")
    block = doc.split("Complete plugin", 1)[1].split("::\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    return "\n".join(lines)


def load_example(port: type[ports.Port]) -> types.ModuleType:
    """Run ``port``'s example as a fresh module and return it (a plugin: it has a hookimpl)."""
    module = types.ModuleType(f"yeto_example_{port.__name__.lower()}")
    exec(compile(example_source(port), f"<{port.__name__} example>", "exec"), module.__dict__)
    return module


def example_class(port: type[ports.Port]) -> type:
    """The one class of ``port``'s example that implements ``port``."""
    module = load_example(port)
    found = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, port) and v is not port
    ]
    if len(found) != 1:
        raise AssertionError(f"{port.__name__}'s example defines {found}, not one implementation")
    return found[0]
