"""tests/ecosystem: the distributions as a user gets them (wheels, a fresh venv)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # dists.py
