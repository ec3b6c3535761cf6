"""A checkpoint's bytes (hetfed.runs.tensor_pickle): every tensor a checkpoint may hold comes back with its dtype,
shape, values and requires_grad, and a checkpoint written by torch.save (an earlier hetfed's) still reads."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from hetfed.runs import tensor_pickle

TENSORS = {
    "float32": torch.randn(64, 10),
    "bfloat16": torch.randn(3, 5).to(torch.bfloat16),
    "float16": torch.randn(4).half(),
    "float64": torch.randn(2, 2, dtype=torch.float64),
    "bool": torch.rand(7) > 0.5,
    "uint8 (torch's generator state)": torch.get_rng_state(),
    "int64": torch.arange(12).reshape(3, 4),
    "complex, conjugated": torch.randn(3, dtype=torch.complex64).conj(),
    "negative view": torch.randn(3, dtype=torch.complex64).conj().imag,
    "transposed": torch.randn(4, 6).t(),
    "strided slice": torch.randn(10, 10)[::3, 1::2],
    "expanded (zero stride)": torch.randn(1, 5).expand(4, 5),
    "zero-dimensional": torch.tensor(3.5),
    "empty": torch.empty(0, 7),
    "float8 (no numpy dtype)": torch.randn(6).to(torch.float8_e4m3fn),
    "sparse": torch.randn(3, 3).relu().to_sparse(),
}


def _round_trip(payload: object) -> object:
    buffer = io.BytesIO()
    tensor_pickle.dump(payload, buffer)
    buffer.seek(0)
    return tensor_pickle.load(buffer)


@pytest.mark.parametrize("name", list(TENSORS))
def test_a_tensor_comes_back_with_its_dtype_shape_and_values(name: str) -> None:
    t = TENSORS[name]
    back = _round_trip({"t": t})["t"]
    assert back.dtype == t.dtype and back.shape == t.shape and back.layout == t.layout and back.device.type == "cpu"
    dense = (lambda x: x.to_dense()) if t.is_sparse else (lambda x: x)
    assert torch.equal(dense(back).view(torch.uint8) if t.dtype == torch.float8_e4m3fn else dense(back),
                       dense(t).view(torch.uint8) if t.dtype == torch.float8_e4m3fn else dense(t).resolve_conj()
                       .resolve_neg())


def test_requires_grad_and_the_payloads_other_objects_come_back() -> None:
    leaf = torch.randn(3, requires_grad=True)
    payload = {"leaf": leaf, "plain": [1, 2.5, "x", None], "mask": np.array([True, False]), "same": leaf}
    back = _round_trip(payload)
    assert back["leaf"].requires_grad and torch.equal(back["leaf"], leaf.detach())
    assert back["plain"] == [1, 2.5, "x", None] and back["mask"].tolist() == [True, False]
    assert back["same"] is back["leaf"]  # one tensor named twice stays one


def test_the_tensors_read_back_are_writable_and_their_own() -> None:
    t = torch.zeros(4)
    back = _round_trip(t)
    back.add_(1)  # a resumed run updates its state in place
    assert torch.equal(t, torch.zeros(4)) and torch.equal(back, torch.ones(4))


def test_a_checkpoint_written_by_torch_save_still_reads() -> None:
    buffer = io.BytesIO()
    torch.save({"version": 2, "w": torch.arange(5.0)}, buffer)
    buffer.seek(0)
    back = tensor_pickle.load(buffer)
    assert back["version"] == 2 and torch.equal(back["w"], torch.arange(5.0))


def test_a_cuda_tensor_is_written_from_the_host() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    back = _round_trip(torch.arange(3.0, device="cuda"))
    assert back.device.type == "cpu" and torch.equal(back, torch.arange(3.0))
