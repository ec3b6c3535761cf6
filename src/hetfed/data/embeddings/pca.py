"""``pca``: principal components fitted on the training split (``embed.components`` of them)."""

from __future__ import annotations

from hetfed.config import EmbedConfig
from hetfed.data.embed import Embedded, flat, wrap
from hetfed.data.embeddings import EmbeddingKind, register
from hetfed.data.loading import Dataset
from hetfed.errors import DataError


def pca(ds: Dataset, cfg: EmbedConfig, progress: bool) -> Embedded:
    """PCA fitted on the train split only, so no test information leaks in."""
    from sklearn.decomposition import PCA

    tr, te = flat(ds.x_train), flat(ds.x_test)
    limit = min(tr.shape)
    if cfg.components > limit:
        raise DataError(
            f"embed.components = {cfg.components} is not allowed for {ds.name}: "
            f"expected at most {limit} (min of samples and features)"
        )
    pca = PCA(n_components=cfg.components, random_state=0).fit(tr)
    return wrap(ds, pca.transform(tr), pca.transform(te), (cfg.components,), "pca")


register(EmbeddingKind("pca", pca, "principal components of the training split", ("image", "vector"),
                       reads=("components",)))
