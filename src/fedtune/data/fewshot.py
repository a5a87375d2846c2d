"""FewFedPIT's few-shot tenant data: cluster, keep a few per cluster, split by Dirichlet.

FewFedPIT (Section 4 and Appendix A) builds its federated few-shot datasets by embedding every
instance, clustering the dataset into 100 clusters with KMeans (after Li et al. 2023a, for
instruction diversity), taking 5 or 10 samples from each cluster, and partitioning them among
clients with a Dirichlet(1.0) distribution over the cluster labels (Hsu et al. 2019).

:func:`fewshot_clusters` does exactly that:

1. embed each record's instruction (plus its input, when it has one) with
   :func:`fedtune.data.embed.embed_texts` (MiniLM, or TF-IDF where it is not installed);
2. KMeans (scikit-learn, ``n_init=10``, seeded) into ``clusters`` clusters;
3. keep ``per_cluster`` records of each cluster, chosen by a seeded generator (a smaller
   cluster keeps all its records);
4. write the cluster label into each kept record (field ``cluster``) and split the kept records
   with :func:`fedtune.data.partition.dirichlet` over that field.

The same records, tenants, options and seed give the same split, record for record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from fedtune.core.errors import ConfigError, DataError
from fedtune.data.embed import Embedder, embed_texts, resolve_embedding
from fedtune.data.formats import detect_format, to_example
from fedtune.data.partition import check_alpha, dirichlet

__all__ = ["CLUSTER_FIELD", "FewShotSplit", "fewshot_clusters", "instruction_texts"]

#: The field each kept record gets, holding its cluster label.
CLUSTER_FIELD: Final = "cluster"
# Fixed so results never depend on scikit-learn's default, which has changed before.
_KMEANS_N_INIT: Final = 10


@dataclass(frozen=True)
class FewShotSplit:
    """A few-shot split and how it was made.

    Attributes:
        parts: ``{tenant: records}``, each record with its ``cluster`` label added.
        embedding: The embedder used (``minilm`` or ``tfidf``).
        clusters: The number of KMeans clusters.
        kept: Records kept over all tenants.
        total: Records in the input.
    """

    parts: dict[str, list[dict[str, Any]]]
    embedding: Embedder
    clusters: int
    kept: int
    total: int


def instruction_texts(
    records: Sequence[Mapping[str, Any]], *, source: str = "<records>"
) -> list[str]:
    """The text to embed per record: its instruction, then its input on a new line if any.

    The record format (Alpaca, Dolly, GSM8K) is detected from the first record, as when
    the dataset is loaded for training.

    Raises:
        DataError: On a record of the wrong format or one with an empty instruction.
    """
    texts: list[str] = []
    format = detect_format(records[0], source=source) if records else None
    for index, record in enumerate(records):
        where = f"{source}, record {index + 1}"
        example = to_example(record, format, source=where)
        if not example.instruction.strip():
            raise DataError(
                f"{where}: the instruction is empty, so there is nothing to cluster it by",
                fix="Fill in the instruction of that record or drop the record.",
            )
        if CLUSTER_FIELD in record:
            raise DataError(
                f"{where}: already has a field {CLUSTER_FIELD!r} "
                f"({str(record[CLUSTER_FIELD])[:60]!r}), which the split would overwrite",
                fix=f"Rename or drop the {CLUSTER_FIELD!r} field before partitioning.",
            )
        text = example.instruction
        texts.append(f"{text}\n{example.input}" if example.input else text)
    return texts


def _check_options(n_records: int, clusters: int, per_cluster: int, alpha: float) -> None:
    if clusters < 1:
        raise ConfigError(
            f"clusters must be at least 1, got {clusters}",
            fix="Use e.g. --clusters 100 as FewFedPIT does.",
        )
    if per_cluster < 1:
        raise ConfigError(
            f"per-cluster must be at least 1, got {per_cluster}",
            fix="Use e.g. --per-cluster 5 or 10 as FewFedPIT does.",
        )
    check_alpha(alpha)
    if clusters > n_records:
        raise DataError(
            f"{clusters} clusters asked for but the dataset has only {n_records} record(s)",
            fix=f"Use --clusters {n_records} or fewer, or a larger dataset.",
        )


def _sample(labels: NDArray[np.int_], clusters: int, per_cluster: int, seed: int) -> list[int]:
    """Indices of up to ``per_cluster`` records of each cluster, sorted."""
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    for label in range(clusters):
        members = np.flatnonzero(labels == label)
        take = min(per_cluster, len(members))
        chosen.extend(rng.choice(members, size=take, replace=False).tolist())
    return sorted(chosen)


def fewshot_clusters(
    records: Sequence[Mapping[str, Any]],
    tenants: Sequence[str],
    *,
    clusters: int = 100,
    per_cluster: int = 5,
    alpha: float = 1.0,
    embedding: str = "auto",
    seed: int = 0,
    source: str = "<records>",
) -> FewShotSplit:
    """Few-shot tenant data after FewFedPIT (see the module docstring for the steps).

    Args:
        records: The whole dataset (Alpaca, Dolly or GSM8K records).
        tenants: Tenant names, in output order.
        clusters: KMeans clusters (FewFedPIT: 100).
        per_cluster: Records kept per cluster (FewFedPIT: 5 or 10).
        alpha: Dirichlet concentration over cluster labels (FewFedPIT: 1.0).
        embedding: ``auto``, ``minilm`` or ``tfidf`` (see :mod:`fedtune.data.embed`).
        seed: Seeds KMeans, the per-cluster choice and the Dirichlet split.
        source: The dataset's name in error messages.

    Raises:
        ConfigError: On ``clusters`` or ``per_cluster`` below 1 or an unknown embedding.
        DataError: On ``alpha <= 0``, more clusters than records, a bad or empty-instruction
            record, or a split that leaves a tenant empty.
        ModelError: If ``minilm`` is asked for and not installed.
    """
    _check_options(len(records), clusters, per_cluster, alpha)
    resolve_embedding(embedding)  # fail on a bad name before reading every record
    texts = instruction_texts(records, source=source)
    used, vectors = embed_texts(texts, embedding)

    from sklearn.cluster import KMeans

    kmeans = KMeans(n_clusters=clusters, n_init=_KMEANS_N_INIT, random_state=seed)
    labels = kmeans.fit_predict(vectors)
    kept = [
        {**records[i], CLUSTER_FIELD: int(labels[i])}
        for i in _sample(labels, clusters, per_cluster, seed)
    ]
    parts = dirichlet(kept, tenants, CLUSTER_FIELD, alpha, seed=seed)
    return FewShotSplit(
        parts=parts, embedding=used, clusters=clusters, kept=len(kept), total=len(records)
    )
