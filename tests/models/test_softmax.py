"""The padded log-softmax (:mod:`hetfed.models.softmax`): torch's numbers for every number of classes, padded only
below the CPU vector's width."""

from __future__ import annotations

import pytest
import torch

from hetfed.models import softmax


@pytest.mark.parametrize(("capability", "width"), [("AVX512", 16), ("AVX512_BF16", 16), ("AVX2", 8),
                                                   ("DEFAULT", 8), ("SVE256", 8)])
def test_pad_width_is_the_vector_of_floats(capability: str, width: int) -> None:
    assert softmax.pad_width(capability) == width


@pytest.mark.parametrize("width", [8, 16])
@pytest.mark.parametrize("classes", [1, 2, 7, 8, 10, 15, 16, 21])
def test_padded_softmax_gives_torchs_numbers(monkeypatch: pytest.MonkeyPatch, width: int, classes: int) -> None:
    monkeypatch.setattr(softmax, "PAD_TO", width)
    logits = torch.randn(3, 40, classes, generator=torch.Generator().manual_seed(classes)) * 5
    wide = softmax.padded(logits)
    assert (wide is None) == (classes >= width)
    if wide is not None:
        assert wide.shape[-1] == width and torch.equal(wide[..., :classes], logits)
    logp, p = softmax.log_softmax_and_softmax(logits)
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(p, torch.softmax(logits, -1), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(softmax.log_softmax(logits), torch.log_softmax(logits, -1), rtol=1e-6, atol=1e-6)
    y = torch.randint(0, classes, (3, 40))
    torch.testing.assert_close(softmax.row_cross_entropy(logits, y),
                               torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none"))


@pytest.mark.parametrize("shape", [(1, 1, 10), (1, 3, 10), (200, 32, 10), (7, 17, 3)])
def test_softmax_is_a_new_tensor_with_the_padded_rows_exponential(shape: tuple[int, ...]) -> None:
    """The softmax (the padded rows' real columns copied, then exponentiated in place) is the exponential of the
    padded log-softmax bit for bit, and a tensor of its own even where the columns' view is contiguous (one row):
    a written-out cross-entropy changes it in place, and the log-softmax must not move."""
    logits = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))) * 8
    logp, p = softmax.log_softmax_and_softmax(logits)
    kept = logp.clone()
    wide = softmax.padded(logits)
    if wide is not None:
        assert torch.equal(p, torch.log_softmax(wide, -1).exp()[..., : shape[-1]])
    p.add_(1.0)
    assert torch.equal(logp, kept)
