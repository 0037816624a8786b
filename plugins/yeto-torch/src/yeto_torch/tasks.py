"""Built-in verifiable tasks: 4-digit sorting, single-digit and two-digit addition.

A prompt is a pure function of ``(seed, index)``, so a dispenser replays the
same prompts after a restart. Rewards are exact match by default;
``partial=True`` gives per-position credit (the fraction of answer characters
that are right, zero on a length mismatch).
"""

from __future__ import annotations

import random

from yeto_core.ports import Task


def _rng(seed: int, index: int, salt: str) -> random.Random:
    return random.Random(f"{salt}:{seed}:{index}")


def score(answer: str, completion: str, *, partial: bool = False) -> float:
    """Exact match (or per-position partial credit) of ``completion`` against ``answer``."""
    got = completion.strip()
    if got == answer:
        return 1.0
    if not partial or len(got) != len(answer):
        return 0.0
    return sum(a == b for a, b in zip(answer, got, strict=True)) / len(answer)


class _DigitTask(Task):
    def __init__(self, seed: int = 0, partial: bool = False, **options):
        if options:
            raise TypeError(
                f"task {self.PLUGIN_NAME!r}: unknown options {sorted(options)}; "
                "allowed: seed, partial"
            )
        self.seed = int(seed)
        self.partial = bool(partial)

    def reward(self, answer: str, completion: str) -> float:
        return score(answer, completion, partial=self.partial)


class SortDigits(_DigitTask):
    """``"3142:"`` → ``"1234"``: sort four digits ascending."""

    PLUGIN_NAME = "sort4"

    def prompt(self, index: int) -> tuple[str, str]:
        digits = [str(d) for d in _rng(self.seed, index, "sort4").choices(range(10), k=4)]
        return "".join(digits) + ":", "".join(sorted(digits))


class AddOneDigit(_DigitTask):
    """``"3+4="`` → ``"7"``: add two single digits."""

    PLUGIN_NAME = "add1"

    def prompt(self, index: int) -> tuple[str, str]:
        r = _rng(self.seed, index, "add1")
        a, b = r.randrange(10), r.randrange(10)
        return f"{a}+{b}=", str(a + b)


class AddTwoDigits(_DigitTask):
    """``"23+45="`` → ``"68"``: add two two-digit numbers."""

    PLUGIN_NAME = "add2"

    def prompt(self, index: int) -> tuple[str, str]:
        r = _rng(self.seed, index, "add2")
        a, b = r.randrange(10, 100), r.randrange(10, 100)
        return f"{a}+{b}=", str(a + b)


TASKS: dict[str, type[Task]] = {t.PLUGIN_NAME: t for t in (SortDigits, AddOneDigit, AddTwoDigits)}
