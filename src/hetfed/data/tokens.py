"""Texts → fixed-length token ids, for models that learn their own embedding (the BiLSTM).

The vocabulary is fitted on the training split only (the test split never
chooses a word), ordered by training frequency (ties by the word), so the same
data always gives the same ids. Id 0 is padding, id 1 every word outside the
vocabulary. Words are scikit-learn's: lower-cased ``\\b\\w+\\b`` runs
(``CountVectorizer``'s analyser, with one-letter words kept). Texts are cut to
their first ``max_length`` words and padded at the end with 0; the model reads
the true length from the padding.

Token ids are not features — a Fréchet distance between them means nothing —
so the step also returns a bag-of-words view for measuring Γ and clustering
clients: TF-IDF over the same vocabulary, reduced by a truncated SVD (latent
semantic analysis) fitted on the training split.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np

PAD, UNKNOWN = 0, 1
#: what a word is: scikit-learn's token pattern, one-letter words kept (its default drops them)
WORD_PATTERN = r"(?u)\b\w+\b"
#: the width of the bag-of-words (LSA) view Γ is measured on
LSA_COMPONENTS = 64


def word_analyzer() -> Callable[[str], list[str]]:
    """scikit-learn's word tokenizer: lower case, runs of word characters."""
    from sklearn.feature_extraction.text import CountVectorizer

    return CountVectorizer(lowercase=True, token_pattern=WORD_PATTERN).build_analyzer()


def fit_vocabulary(texts: Iterable[str], vocab_size: int, min_count: int = 1) -> list[str]:
    """The ``vocab_size − 2`` most frequent words with at least ``min_count`` uses (index + 2 = id)."""
    analyze = word_analyzer()
    counts = Counter(w for t in texts for w in analyze(str(t)))
    ranked = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    return ranked[: vocab_size - 2]


def encode(texts: Sequence[str] | np.ndarray, vocabulary: Sequence[str], max_length: int) -> np.ndarray:
    """``[N, max_length]`` ids as float32 (exact below 2²⁴), padded with 0 at the end."""
    analyze = word_analyzer()
    index = {w: i + 2 for i, w in enumerate(vocabulary)}
    out = np.full((len(texts), max_length), PAD, dtype=np.float32)
    for row, text in enumerate(texts):
        ids = [index.get(w, UNKNOWN) for w in analyze(str(text))[:max_length]]
        out[row, : len(ids)] = ids
    return out


def bag_of_words(train: Sequence[str] | np.ndarray, vocabulary: Sequence[str],
                 components: int = LSA_COMPONENTS) -> np.ndarray:
    """The training texts' TF-IDF over the vocabulary, reduced by an SVD fitted on them (float32)."""
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    tfidf = TfidfVectorizer(vocabulary=list(vocabulary), lowercase=True, token_pattern=WORD_PATTERN)
    m = tfidf.fit_transform([str(t) for t in train])
    k = max(1, min(components, m.shape[1] - 1, m.shape[0] - 1))
    return TruncatedSVD(n_components=k, random_state=0).fit_transform(m).astype(np.float32)
