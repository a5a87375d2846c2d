"""The two runtime contexts: what the provider's phases may reach, and what a tenant's may.

The boundary between provider and tenants is kept by construction. A phase receives exactly
one of these objects, and each can only reach its own party's things:

- :class:`ProviderContext` (``init_state``, ``configure_round``, ``aggregate``,
  ``final_broadcast``, ``export``): the base model at ``model.uri``, the public dataset and
  the provider-private store.
- :class:`TenantContext` (``client_step``, ``evaluate``): the tenant's own name and seeds,
  and a tokenizer and base weights only from the broadcast package (:meth:`adopt_tokenizer`)
  or from what the job declares readable by tenants (a tiny model's config, or
  ``model.tenant_uri``). It is built from a :class:`TenantBase`, which never holds
  ``model.uri``: tenant code has no path to the provider's checkpoint.

Building the tokenizer and the base model is the expensive part of a phase; a context keeps
them for the life of the process. Every phase still rebuilds its trainable state from the
messages it receives, so caching never changes results. torch, tokenizing (transformers) and
LoRA (PEFT) are imported where they are used: provider steps that only move tensors
(configure, aggregate) start without transformers and PEFT, bookkeeping steps without torch.
"""

from __future__ import annotations

import hashlib
import logging
import random
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fedtune.config.job import (
    JobConfig,
    LimitsConfig,
    LoraConfig,
    ModelConfig,
    PretrainedModelConfig,
    TinyModelConfig,
    TrainingConfig,
)
from fedtune.core.errors import ConfigError, ModelError, StoreError, StoreUnavailable
from fedtune.data.formats import Example
from fedtune.training.progress import ProgressHook, logged_progress
from fedtune.training.shared import SharedBase as SharedBase  # re-exported

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from fedtune.config.tenant_view import TenantJob
    from fedtune.training.local import Batch
    from fedtune.training.precision import Runtime

T = TypeVar("T")
log = logging.getLogger(__name__)
_ENCODED_KEPT = 8  # encodings a context keeps: a tenant's train and eval splits, a public set


@dataclass(frozen=True)
class TenantData:
    """One tenant's examples, split into training and held-out evaluation parts."""

    tenant: str
    train: Sequence[Example]
    eval: Sequence[Example]


def derive_seed(seed: int, *parts: object) -> int:
    """A stable 31-bit seed for (job seed, round, tenant, ...), independent of hash salting."""
    digest = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def split_indices(
    count: int, eval_fraction: float, seed: int, tenant: str
) -> tuple[list[int], list[int]]:
    """Positions of the training and held-out examples among ``count`` (seeded)."""
    order = list(range(count))
    random.Random(derive_seed(seed, "split", tenant)).shuffle(order)
    n_eval = min(int(count * eval_fraction), max(0, count - 1))
    return order[n_eval:], order[:n_eval]


def split_examples(
    examples: Sequence[Example], eval_fraction: float, seed: int, tenant: str
) -> TenantData:
    """Seeded held-out split; at least one training example is always kept."""
    kept, held = split_indices(len(examples), eval_fraction, seed, tenant)
    return TenantData(
        tenant=tenant, train=[examples[i] for i in kept], eval=[examples[i] for i in held]
    )


def own_store_part(uri: str, store_uri: str | None, tenant: str, what: str) -> Any:
    """A tenant's own store confined to ``uri``, where ``uri`` is remote (``s3://``); None for
    a local path (the tenant's own disk).

    A tenant reads its own model and tokenizer through its own store (its endpoint and
    credentials), and only below that store's prefix: ``store.child`` refuses keys that
    climb out of it.

    Raises:
        ConfigError: ``uri`` is remote but not under the tenant's ``store_uri``.
    """
    if not uri.startswith("s3://"):
        return None
    from fedtune.storage import open_store

    root = (store_uri or "").rstrip("/")
    target = uri.rstrip("/")
    if not root.startswith("s3://") or not target.startswith(root + "/"):
        raise ConfigError(
            f"tenant {tenant!r}: its own {what} {uri!r} is not inside its store "
            f"{store_uri!r}; a tenant reads its own model and tokenizer only from its own store",
            fix=f"Upload the {what} below tenants[{tenant}].store_uri and point at it there "
            "(or use a local path).",
        )
    return open_store(root).child(target[len(root) + 1 :])


def build_model(
    config: ModelConfig | str,
    tokenizer_spec: str,
    *,
    tenant: str | None = None,
    store_uri: str | None = None,
    runtime: Runtime | None = None,
) -> tuple[PreTrainedModel, Any]:
    """A frozen base model and its tokenizer from a tiny config or a model directory URI.

    With ``tenant`` set (a tenant's own model), remote URIs are read through the tenant's
    own store ``store_uri`` and must lie inside it (:func:`own_store_part`). The model is
    loaded in ``runtime``'s dtype and placed on its device (default: fp32 on the CPU).
    """
    from fedtune.models.loading import load_pretrained, load_pretrained_from_store
    from fedtune.models.tiny import build_tiny_model
    from fedtune.models.tokenizer import load_tokenizer, load_tokenizer_from_store
    from fedtune.training.precision import Runtime

    runtime = runtime or Runtime()

    def tokenizer_of(spec: str) -> Any:
        part = own_store_part(spec, store_uri, tenant, "tokenizer") if tenant else None
        return load_tokenizer(spec) if part is None else load_tokenizer_from_store(part, shown=spec)

    if isinstance(config, TinyModelConfig):
        tokenizer = tokenizer_of("builtin" if tokenizer_spec == "auto" else tokenizer_spec)
        model = build_tiny_model(
            config.arch,
            vocab_size=len(tokenizer),
            hidden_size=config.hidden_size,
            num_layers=config.num_layers,
            num_heads=config.num_heads,
            intermediate_size=config.intermediate_size,
            max_position_embeddings=config.max_position_embeddings,
            seed=config.init_seed,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            dtype=runtime.dtype,
        )
    else:
        uri = config.uri if isinstance(config, PretrainedModelConfig) else config
        part = own_store_part(uri, store_uri, tenant, "model") if tenant else None
        if part is None:
            model, tokenizer = load_pretrained(uri, dtype=runtime.dtype)
        else:
            model, tokenizer = load_pretrained_from_store(part, shown=uri, dtype=runtime.dtype)
        if tokenizer_spec != "auto":
            tokenizer = tokenizer_of(tokenizer_spec)
    for param in model.parameters():
        param.requires_grad_(False)
    runtime.place(model)
    first = next(iter(model.parameters()), None)
    if first is not None and first.device.type != "meta":  # what the model really is
        log.info("%s ready: %s on %s", type(model).__name__, str(first.dtype).removeprefix("torch."),
                 first.device)
    return model, tokenizer


def _arch_of(model: torch.nn.Module) -> str:
    return "gpt2" if getattr(model.config, "model_type", "") == "gpt2" else "llama"


@dataclass(frozen=True)
class ExampleBatches:
    """``steps`` seeded batches of ``batch_size`` drawn epoch by epoch from ``encoded`` (iterate
    for them). The examples stay reachable: a tenant's DP-SGD draws Poisson batches from them
    instead (:mod:`fedtune.training.dp_sgd`)."""

    encoded: Sequence[dict[str, list[int]]]
    steps: int
    seed: int
    batch_size: int
    pad_id: int

    def __iter__(self) -> Iterator[Batch]:
        from fedtune.data.tokenize import collate
        from fedtune.training.local import batch_indices

        for idx in batch_indices(len(self.encoded), self.batch_size, self.steps, self.seed):
            yield collate([self.encoded[i] for i in idx], self.pad_id)


@dataclass
class _Encoding:
    """Tokenization and batching shared by both contexts (needs ``tokenizer()``)."""

    seed: int
    lora_config: LoraConfig
    training: TrainingConfig
    #: The job's bounds on dataset records and store waits (None: the defaults).
    limits: LimitsConfig | None = None

    def tokenizer(self) -> Any:  # pragma: no cover - both subclasses override
        raise NotImplementedError

    @property
    def runtime(self) -> Runtime:
        """Device, precision and checkpointing of the job's models (see
        :mod:`fedtune.training.precision`), resolved once on this machine.

        Raises:
            ConfigError: ``training.device: cuda`` without CUDA here, or fp16 on the CPU.
        """
        from fedtune.training.precision import Runtime

        cached = self.__dict__.get("_runtime")
        if cached is None:
            cached = self.__dict__["_runtime"] = Runtime.of(self.training)
        return cached

    def encode(self, examples: Sequence[Example]) -> list[dict[str, list[int]]]:
        """Tokenize examples with response-only labels.

        A tenant's data object is the same every round, so its encoding is kept (per
        examples object and tokenizer) instead of being redone in every client step.
        """
        from fedtune.data.tokenize import encode_examples

        tokenizer = self.tokenizer()
        cache: dict[tuple[int, int], Any] = self.__dict__.setdefault("_encoded", {})
        key = (id(examples), id(tokenizer))
        hit = cache.get(key)
        # The cache holds the examples and the tokenizer, so their ids cannot be reused.
        if hit is None or hit[0] is not examples or hit[1] is not tokenizer:
            # Records whose prompt alone exceeds max_seq_len are skipped (counted in the log).
            hit = (examples, tokenizer, encode_examples(examples, tokenizer, self.training.max_seq_len))
            cache[key] = hit
            while len(cache) > _ENCODED_KEPT:  # one-off encodings (single examples) pass through
                del cache[next(iter(cache))]
        return list(hit[2])

    def train_batches(
        self, encoded: Sequence[dict[str, list[int]]], steps: int, seed: int
    ) -> ExampleBatches:
        """``steps`` seeded batches drawn epoch by epoch from ``encoded``."""
        return ExampleBatches(encoded, steps, seed, self.training.batch_size, self.tokenizer().pad_token_id)

    def eval_batches(self, encoded: Sequence[dict[str, list[int]]]) -> Iterator[Batch]:
        """Every held-out example once, in order."""
        from fedtune.data.tokenize import collate

        pad_id = self.tokenizer().pad_token_id
        size = self.training.batch_size
        for start in range(0, len(encoded), size):
            yield collate(list(encoded[start : start + size]), pad_id)

    def _peft(self, cache: dict[str, Any], base: PreTrainedModel, arch: str, adapter: Any) -> Any:
        """The base wrapped with LoRA (once); ``adapter`` loaded, else the seeded initial one."""
        import torch

        from fedtune.models import lora as lora_helpers

        if "peft" not in cache:
            torch.manual_seed(derive_seed(self.seed, "lora-init"))
            cache["peft"] = lora_helpers.apply_lora(
                base,
                r=self.lora_config.r,
                alpha=self.lora_config.alpha,
                dropout=self.lora_config.dropout,
                target_modules=self.lora_config.target_modules,
                arch=arch,
            )
            self.runtime.prepare(cache["peft"])
            cache["peft-init"] = lora_helpers.adapter_state(cache["peft"])
        model = cache["peft"]
        lora_helpers.set_adapter_state(model, adapter if adapter is not None else cache["peft-init"])
        model.eval()
        return model


@dataclass
class ProviderContext(_Encoding):
    """The provider's phases: its base model, its public data, its private store."""

    model_config: ModelConfig = field(default=None)  # type: ignore[assignment]
    tokenizer_spec: str = "auto"
    num_tenants: int = 1
    public_data_uri: str | None = None
    store: Any = None  # the provider-private Store (states, summaries, exports)
    #: Tokenizer spec of each tenant's own model (fedmkt): tokenizers are declared public.
    tenant_tokenizers: dict[str, str] = field(default_factory=dict)
    #: ``export.merged``: exports add a copy with the adapter merged in.
    export_merged: bool = False
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_job(cls, job: JobConfig, store: Any = None) -> ProviderContext:
        """The sections of ``job`` the provider's phases read."""
        return cls(
            seed=job.seed,
            lora_config=job.lora,
            training=job.training,
            limits=job.limits,
            model_config=job.model,
            tokenizer_spec=job.tokenizer,
            num_tenants=len(job.tenants),
            public_data_uri=job.public_data_uri,
            store=store,
            export_merged=job.export.merged,
            tenant_tokenizers={
                t.name: tenant_tokenizer_spec(t.model, t.tokenizer) for t in job.tenants if t.model
            },
        )

    @property
    def arch(self) -> str:
        """``llama`` or ``gpt2``: decides LoRA targets and layer names."""
        if isinstance(self.model_config, TinyModelConfig):
            return self.model_config.arch
        return _arch_of(self.base_model())

    def tokenizer(self) -> Any:
        """The job's tokenizer."""
        if "tokenizer" not in self._cache:
            self._load_base()
        return self._cache["tokenizer"]

    def base_model(self) -> PreTrainedModel:
        """The frozen base model (never trained in place)."""
        if "base" not in self._cache:
            self._load_base()
        base: PreTrainedModel = self._cache["base"]
        return base

    def _load_base(self) -> None:
        self._cache["base"], self._cache["tokenizer"] = self.build_base()

    def build_base(self) -> tuple[PreTrainedModel, Any]:
        """A new, uncached copy of the frozen base model and its tokenizer.

        The cached base model is wrapped by PEFT in place once LoRA is applied; export uses
        this to write pristine base weights beside the adapter.
        """
        return build_model(self.model_config, self.tokenizer_spec, runtime=self.runtime)

    def memo(self, key: str, build: Callable[[], T]) -> T:
        """``build()`` once per process: provider-side things an algorithm keeps (FedPT's
        large model). Never results that depend on a round: phases stay pure functions of
        their messages."""
        cache_key = f"memo:{key}"
        if cache_key not in self._cache:
            self._cache[cache_key] = build()
        return self._cache[cache_key]  # type: ignore[no-any-return]

    def peft_model(self, adapter: dict[str, torch.Tensor] | None = None) -> Any:
        """The base model wrapped with LoRA; with ``adapter``, those weights are loaded.

        Without ``adapter`` the LoRA weights are freshly initialised from the job seed (the
        initial global adapter).
        """
        return self._peft(self._cache, self.base_model(), self.arch, adapter)

    def public_examples(self) -> list[Example]:
        """The provider's public dataset (the job's ``public_data_uri``), read once.

        Raises:
            ConfigError: ``public_data_uri`` is not set, or names nothing readable.
            DataError: A record of the dataset is malformed.
        """
        if "public" not in self._cache:
            self._cache["public"] = read_public(self.public_data_uri, self.limits)
        return list(self._cache["public"])


def read_public(uri: str | None, limits: LimitsConfig | None = None) -> list[Example]:
    """The public dataset at ``uri`` (the job's ``public_data_uri``).

    Raises:
        ConfigError: ``uri`` is not set, or names nothing readable.
        DataError: A record of the dataset is malformed.
    """
    from fedtune.data.loader import read_examples

    if not uri:
        raise ConfigError(
            "public_data_uri is not set, but the algorithm trains on a public dataset",
            fix="Set public_data_uri in the job file to a JSON Lines dataset the provider "
            "may use (e.g. examples/data/quickstart/public.jsonl).",
        )
    try:
        return read_examples(uri, limits=limits)
    except StoreUnavailable:
        raise  # an outage, not a wrong setting
    except StoreError as exc:
        raise ConfigError(
            f"public_data_uri={uri!r} cannot be read: {exc}",
            fix="Point public_data_uri at an existing JSON Lines file or object.",
        ) from exc


def tenant_tokenizer_spec(model: ModelConfig, tokenizer: str | None) -> str:
    """The tokenizer a tenant's own model uses: its ``tokenizer``, else the model's own
    (``builtin`` for a tiny model, the model directory otherwise)."""
    if tokenizer and tokenizer != "auto":
        return tokenizer
    return "builtin" if isinstance(model, TinyModelConfig) else model.uri


@dataclass(frozen=True)
class TenantBase:
    """What a job declares readable by tenants: a tiny model's config, or ``model.tenant_uri``.

    ``model`` is ``None`` when tenants get nothing but the broadcast (FedBiOT and its
    baselines): then every weight and the tokenizer must come from the package.
    """

    model: TinyModelConfig | str | None
    tokenizer_spec: str = "auto"
    #: Set for a tenant's own model (FedMKT): remote URIs are read through the tenant's own
    #: store ``store_uri`` and must lie inside it.
    owner: str | None = None
    store_uri: str | None = None

    def build(self, runtime: Runtime | None = None) -> tuple[PreTrainedModel, Any]:
        """The frozen base model and tokenizer this base names (see :func:`build_model`)."""
        assert self.model is not None  # callers check first
        return build_model(
            self.model, self.tokenizer_spec, tenant=self.owner, store_uri=self.store_uri,
            runtime=runtime,
        )

    @classmethod
    def of_view(cls, view: TenantJob) -> TenantBase:
        """The base a tenant's view names (never ``model.uri``): the tenant's own model where
        its entry names one (FedMKT), else what the job declares readable by tenants."""
        entry = view.tenant
        if entry.model is not None:
            own = entry.model if isinstance(entry.model, TinyModelConfig) else entry.model.uri
            return cls(
                model=own, tokenizer_spec=entry.tokenizer or "auto", owner=entry.name,
                store_uri=entry.store_uri,
            )
        return cls(model=view.base_model, tokenizer_spec=view.tokenizer)


@dataclass
class TenantContext(_Encoding):
    """A tenant's phases: the broadcast's package, the tenant's data, its own store.

    There is no method that reaches ``model.uri``: the only model source is :attr:`base`.
    """

    tenant: str = ""
    base: TenantBase = field(default_factory=lambda: TenantBase(model=None))
    #: The public dataset, only where the algorithm declares it shared with tenants (fedmkt's
    #: ``tenants_read_public``); None otherwise, so no other tenant step can read it.
    public_data_uri: str | None = None
    shared: SharedBase = field(default_factory=SharedBase, repr=False)
    #: Shows long work inside a step (the local engine sets a rich bar; default: log lines).
    progress: ProgressHook = field(default=logged_progress, repr=False)
    _package_tokenizer: Any = field(default=None, repr=False)

    @classmethod
    def of_view(cls, view: TenantJob, shared: SharedBase | None = None) -> TenantContext:
        """The context of the tenant whose view this is: seeds, LoRA and training settings,
        its base, and the public set where the algorithm shares it."""
        return cls(
            seed=view.seed,
            lora_config=view.lora,
            training=view.training,
            limits=view.limits,
            tenant=view.name,
            base=TenantBase.of_view(view),
            shared=shared or SharedBase(),
            public_data_uri=view.public_data_uri,
        )

    def shared_public_examples(self) -> list[Example]:
        """The public dataset the algorithm shares with every party, read once per process.

        Raises:
            ConfigError: The algorithm shares no public set with tenants, or it is unreadable.
        """
        cache = self.shared.cache.setdefault(f"public:{self.public_data_uri}", {})
        if "examples" not in cache:
            cache["examples"] = read_public(self.public_data_uri, self.limits)
        return list(cache["examples"])

    # -- the package's tokenizer ------------------------------------------------------------
    def adopt_tokenizer(self, files: Mapping[str, torch.Tensor]) -> None:
        """Use the tokenizer files a broadcast package carries (uint8 tensors by file name)."""
        self._package_tokenizer = tokenizer_from_tensors(files)

    def tokenizer(self) -> Any:
        """The package's tokenizer if one was adopted, else the tenant-readable base's."""
        if self._package_tokenizer is not None:
            return self._package_tokenizer
        return self._load()[1]

    # -- the tenant-readable base -------------------------------------------------------------
    @property
    def arch(self) -> str:
        """``llama`` or ``gpt2`` of the tenant-readable base."""
        if isinstance(self.base.model, TinyModelConfig):
            return self.base.model.arch
        return _arch_of(self.base_model())

    def base_model(self) -> PreTrainedModel:
        """The frozen tenant-readable base model."""
        return self._load()[0]

    def peft_model(self, adapter: dict[str, torch.Tensor] | None = None) -> Any:
        """The tenant-readable base wrapped with LoRA, ``adapter`` loaded (see ProviderContext)."""
        return self._peft(self._cache(), self.base_model(), self.arch, adapter)

    def _cache(self) -> dict[str, Any]:
        key = repr(self.base)
        cache: dict[str, Any] = self.shared.cache.setdefault(key, {"owner": self.base.owner})
        return cache

    def _load(self) -> tuple[PreTrainedModel, Any]:
        if self.base.model is None:
            raise ModelError(
                f"tenant {self.tenant!r}: this algorithm gives tenants no base model, and no "
                "tokenizer was adopted from the broadcast package",
                fix="The algorithm's client step must build its model from the broadcast "
                "(this is a bug in the algorithm, not in the job).",
            )
        cache = self._cache()
        if "base" not in cache:
            cache["base"], cache["tokenizer"] = self.base.build(self.runtime)
        return cache["base"], cache["tokenizer"]


# -- tokenizer files as tensors (how a package carries them) ------------------------------------
def tokenizer_to_tensors(tokenizer: Any) -> dict[str, torch.Tensor]:
    """Every file ``save_pretrained`` writes, as a uint8 tensor named by the file name."""
    import torch

    with tempfile.TemporaryDirectory(prefix="fedtune-tok-") as tmp:
        tokenizer.save_pretrained(tmp)
        return {
            path.name: torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).clone()
            for path in sorted(Path(tmp).iterdir())
            if path.is_file()
        }


def tokenizer_from_tensors(files: Mapping[str, torch.Tensor]) -> Any:
    """Load a tokenizer from the files :func:`tokenizer_to_tensors` packed.

    Raises:
        ModelError: The files are not a loadable tokenizer (or a name is not a plain file).
    """
    import torch

    from fedtune.models.tokenizer import load_tokenizer

    with tempfile.TemporaryDirectory(prefix="fedtune-tok-") as tmp:
        for name, tensor in files.items():
            if "/" in name or name.startswith(".") or tensor.dtype != torch.uint8:
                raise ModelError(
                    f"the package's tokenizer file {name!r} is not a plain file of bytes",
                    fix="The provider and tenant must run the same fedtune version.",
                )
            (Path(tmp) / name).write_bytes(tensor.numpy().tobytes())
        return load_tokenizer(tmp)
