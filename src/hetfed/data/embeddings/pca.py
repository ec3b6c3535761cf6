"""``pca``: principal components fitted on the training split (``embed.components`` of them)."""

from __future__ import annotations

from pydantic import Field

from hetfed.config import EmbedConfig
from hetfed.data.embed import Embedded, flat, wrap
from hetfed.data.embeddings import EmbeddingKind, register
from hetfed.data.loading import Dataset
from hetfed.errors import DataError
from hetfed.registry import ComponentParams


class PCAParams(ComponentParams):
    components: int = Field(32, ge=1, description="output size: the principal components kept")


def pca(ds: Dataset, cfg: EmbedConfig, progress: bool) -> Embedded:
    """PCA fitted on the train split only, so no test information leaks in."""
    from sklearn.decomposition import PCA

    tr, te = flat(ds.x_train), flat(ds.x_test)
    limit = min(tr.shape)
    components = cfg.params.components
    if components > limit:
        raise DataError(
            f"embed.components = {components} is not allowed for {ds.name}: "
            f"expected at most {limit} (min of samples and features)"
        )
    pca = PCA(n_components=components, random_state=0).fit(tr)
    return wrap(ds, pca.transform(tr), pca.transform(te), (components,), "pca")


register(EmbeddingKind("pca", pca, "principal components of the training split", ("image", "vector"),
                       Params=PCAParams, fitted=True))
