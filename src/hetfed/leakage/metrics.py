"""How much an attack learnt: reconstruction quality (PSNR, SSIM: scikit-image), labels recovered, and
membership inference's AUC and TPR at a low FPR (scikit-learn)."""

from __future__ import annotations

import math

import numpy as np

from hetfed.errors import MissingExtraError


def psnr(truth: np.ndarray, guess: np.ndarray, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB of ``guess`` against ``truth`` (values in [0, data_range]); each sample
    scored alone, then averaged (DLG's and Geiping et al.'s convention)."""
    truth, guess = np.asarray(truth, np.float64), np.clip(np.asarray(guess, np.float64), 0, data_range)
    per = [10 * math.log10(data_range**2 / max(float(np.mean((t - g) ** 2)), 1e-12)) for t, g in zip(truth, guess,
                                                                                                  strict=True)]
    return float(np.mean(per))


def ssim(truth: np.ndarray, guess: np.ndarray, data_range: float = 1.0) -> float:
    """Structural similarity (Wang et al. 2004, scikit-image's) of images ``[batch, H, W]``, averaged."""
    try:
        from skimage.metrics import structural_similarity
    except ImportError:
        raise MissingExtraError("SSIM needs scikit-image: pip install 'hetfed[privacy]'") from None
    truth, guess = np.asarray(truth, np.float64), np.clip(np.asarray(guess, np.float64), 0, data_range)
    side = min(truth.shape[-2:])
    window = min(7, side if side % 2 else side - 1)
    return float(np.mean([structural_similarity(t, g, data_range=data_range, win_size=window)
                          for t, g in zip(truth, guess, strict=True)]))


def labels_recovered(truth: np.ndarray, guess: np.ndarray) -> float:
    """The share of the true labels (as a multiset) the guess contains."""
    t, g = np.bincount(truth), np.bincount(guess, minlength=len(np.bincount(truth)))
    return float(np.minimum(t, g[: len(t)]).sum() / max(1, len(truth)))


def membership(scores_members: np.ndarray, scores_others: np.ndarray, fpr: float = 0.01) -> dict[str, float]:
    """AUC of the scores (members positive) and the TPR at ``fpr`` (LiRA's headline number, Carlini et al. 2022)."""
    from sklearn.metrics import roc_auc_score, roc_curve

    y = np.r_[np.ones(len(scores_members)), np.zeros(len(scores_others))]
    s = np.r_[scores_members, scores_others]
    f, t, _ = roc_curve(y, s)
    return {"auc": float(roc_auc_score(y, s)), f"tpr_at_{fpr:g}_fpr": float(np.interp(fpr, f, t))}
