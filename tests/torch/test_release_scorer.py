"""The torch backend's release writer scores the fingerprint from its own copy of the
weights (on the driver's upload thread): the scores the training thread would have
recorded when the copy was taken, in the export dtype, across restores."""

from __future__ import annotations

import pytest

from yeto_core import fingerprint
from yeto_torch.backend import TorchBackend
from yeto_torch.testing import fixed_batches


def _scored(writer, backend):
    return fingerprint.scored_by(
        writer.prompt_logprobs, backend.vocab_size, str(backend.weights_dtype)
    )


@pytest.mark.parametrize("export_dtype", [None, "bfloat16"])
def test_a_writer_scores_what_the_backend_scored_when_it_was_taken(sort_base, export_dtype):
    batches = fixed_batches(sort_base, 2, prompts=4, g=4)
    opts = {"export_dtype": export_dtype} if export_dtype else {}
    b = TorchBackend(str(sort_base), lr=5e-3, seed=0, **opts)
    b.restore(None)
    b.train_round(batches[0])
    first = b.release_writer()
    at_first = fingerprint.for_backend(b)
    b.train_round(batches[1])
    second = b.release_writer()
    at_second = fingerprint.for_backend(b)
    assert at_first != at_second  # the round moved the scores
    assert at_first.dtype == (export_dtype or "float32")
    # both copies are scored after the weights moved on, the older one last
    assert _scored(second, b) == at_second
    assert _scored(first, b) == at_first
    # the trained weights are untouched by the scoring
    assert fingerprint.for_backend(b) == at_second


def test_a_restored_backend_scores_with_its_new_model(sort_base, tmp_path):
    batches = fixed_batches(sort_base, 2, prompts=4, g=4)
    b = TorchBackend(str(sort_base), lr=5e-3, seed=0)
    b.restore(None)
    b.train_round(batches[0])
    _scored(b.release_writer(), b)
    b.restore(None)  # a new model from the base: the copy that scores follows it
    base = fingerprint.for_backend(b)
    assert _scored(b.release_writer(), b) == base
    b.train_round(batches[1])
    assert _scored(b.release_writer(), b) == fingerprint.for_backend(b) != base
