"""Run as a separate process by test_cuts.py: resume a torch backend from a cut and finish.

Usage: python cut_worker.py MODEL_DIR CUT_DIR N_BATCHES TUNING OUT_DIR
Writes OUT_DIR/state.safetensors (every parameter and AdamW tensor) and
OUT_DIR/trained.json (the batch indices this process trained).
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

torch.set_num_threads(2)

from yeto_torch.backend import TorchBackend  # noqa: E402
from yeto_torch.testing import fixed_batches  # noqa: E402

model_dir, cut_dir, n, tuning, out = sys.argv[1:6]
batches = fixed_batches(model_dir, int(n))
be = TorchBackend(model_dir, tuning=tuning, lr=5e-3, seed=3, kl_coef=0.05)
be.restore(Path(cut_dir))
trained = []
for i in range(be.counters["rounds"], int(n)):
    be.train_round(batches[i])
    trained.append(i)
out = Path(out)
out.mkdir(parents=True, exist_ok=True)
save_file(
    {k: v.contiguous().clone() for k, v in be.state_tensors().items()},
    str(out / "state.safetensors"),
)
state = {"trained": trained, "counters": be.counters, "rng": torch.get_rng_state().tolist()[:64]}
(out / "trained.json").write_text(json.dumps(state))
