"""``python head_with_doubles.py SERVICE_DIR yeto ARGS...``: the yeto CLI with Modal doubled.

The head is the real ``yeto`` CLI; only the modal provider's call seam is the
double (``modal_doubles.CallService`` on ``SERVICE_DIR``, shared by every head
that runs this script, as Modal's service is). Containers run the island
functions' real bodies through ``Function.local()``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from modal_doubles import CallService

from yeto_modal.provider import ModalIslands


def main() -> None:
    root = Path(sys.argv[1])
    ModalIslands.seam_factory = lambda: CallService(root)
    from yeto_core.cli import main as yeto

    sys.argv = ["yeto", *sys.argv[3:]]
    yeto()


if __name__ == "__main__":
    main()
