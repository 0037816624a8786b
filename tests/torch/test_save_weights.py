"""The full export's weight file is written by ``save_weights``: byte for byte what
``safetensors``' ``save_file`` writes, for every dtype a release is exported in."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from yeto_torch import export
from yeto_torch.backend import TorchBackend


def _same_as_save_file(tensors, tmp_path):
    export.save_weights(tensors, tmp_path / "ours.safetensors")
    save_file(tensors, str(tmp_path / "ref.safetensors"), metadata={"format": "pt"})
    ours = (tmp_path / "ours.safetensors").read_bytes()
    assert ours == (tmp_path / "ref.safetensors").read_bytes()
    back = load_file(str(tmp_path / "ours.safetensors"))
    assert back.keys() == tensors.keys()
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_a_snapshot_is_written_as_save_file_writes_it(sort_base, tmp_path, dtype):
    b = TorchBackend(str(sort_base), seed=0)
    b.restore(None)
    _same_as_save_file(export.snapshot_full(b.model, dtype=dtype), tmp_path)


def test_odd_tensor_sets_are_written_as_save_file_writes_them(tmp_path):
    g = torch.Generator().manual_seed(0)
    cases = {
        "scalar_and_empty": {"a": torch.tensor(1.5), "b": torch.zeros(0, 3), "c": torch.ones(2)},
        "mixed_dtypes": {"a": torch.ones(3), "b": torch.ones(3, dtype=torch.bfloat16)},
        "names": {"z.w": torch.randn(2, generator=g), "a.b_1": torch.randn(7, 1, generator=g)},
        "unicode": {"poids.é": torch.randn(3, generator=g), 'a"b': torch.randn(1, generator=g)},
    }
    for name, tensors in cases.items():
        (tmp_path / name).mkdir()
        _same_as_save_file(tensors, tmp_path / name)
    strided = {"a": torch.randn(4, 6, generator=g).t(), "b": torch.randn(5, generator=g)}
    with pytest.raises(ValueError, match="non contiguous"):  # refused, as save_file does
        export.save_weights(strided, tmp_path / "strided.safetensors")
