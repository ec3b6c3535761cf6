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
