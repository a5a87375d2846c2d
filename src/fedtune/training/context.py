"""The runtime context a phase receives: narrow config sections plus cached heavy objects.

Building the tokenizer and the base model is the expensive part of a phase; a context keeps
them for the life of the process (one pod on Kubernetes, the whole job in the local engine).
Every phase still rebuilds its trainable state from the messages it receives, so caching never
changes results.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedtune.config.job import JobConfig, LoraConfig, ModelConfig, TinyModelConfig, TrainingConfig
from fedtune.data.formats import Example
from fedtune.data.tokenize import collate, encode_examples
from fedtune.models import lora as lora_helpers
from fedtune.training.local import Batch, batch_indices


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


def split_examples(
    examples: Sequence[Example], eval_fraction: float, seed: int, tenant: str
) -> TenantData:
    """Seeded held-out split; at least one training example is always kept."""
    order = list(range(len(examples)))
    random.Random(derive_seed(seed, "split", tenant)).shuffle(order)
    n_eval = min(int(len(examples) * eval_fraction), max(0, len(examples) - 1))
    held = [examples[i] for i in order[:n_eval]]
    kept = [examples[i] for i in order[n_eval:]]
    return TenantData(tenant=tenant, train=kept, eval=held)


@dataclass
class Context:
    """What phases need beyond their messages: config sections, tokenizer, base model."""

    seed: int
    model_config: ModelConfig
    lora_config: LoraConfig
    training: TrainingConfig
    tokenizer_spec: str = "auto"
    num_tenants: int = 1
    public_data_uri: str | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_job(cls, job: JobConfig) -> Context:
        """The sections of ``job`` that phases read."""
        return cls(
            seed=job.seed,
            model_config=job.model,
            lora_config=job.lora,
            training=job.training,
            tokenizer_spec=job.tokenizer,
            num_tenants=len(job.tenants),
            public_data_uri=job.public_data_uri,
        )

    # -- heavy objects, built once per process ------------------------------------------
    @property
    def arch(self) -> str:
        """``llama`` or ``gpt2``: decides LoRA targets and layer names."""
        if isinstance(self.model_config, TinyModelConfig):
            return self.model_config.arch
        model_type = self.base_model().config.model_type
        return "gpt2" if model_type == "gpt2" else "llama"

    def tokenizer(self) -> Any:
        """The job's tokenizer."""
        if "tokenizer" not in self._cache:
            self._load_base()
        return self._cache["tokenizer"]

    def base_model(self) -> torch.nn.Module:
        """The frozen base model (never trained in place)."""
        if "base" not in self._cache:
            self._load_base()
        return self._cache["base"]

    def _load_base(self) -> None:
        model, tokenizer = self.build_base()
        self._cache["base"] = model
        self._cache["tokenizer"] = tokenizer

    def build_base(self) -> tuple[torch.nn.Module, Any]:
        """A new, uncached copy of the frozen base model and its tokenizer.

        The cached base model is wrapped by PEFT in place once LoRA is applied; export uses
        this to write pristine base weights beside the adapter.
        """
        from fedtune.models.loading import load_pretrained
        from fedtune.models.tiny import build_tiny_model
        from fedtune.models.tokenizer import load_tokenizer

        config = self.model_config
        if isinstance(config, TinyModelConfig):
            spec = "builtin" if self.tokenizer_spec == "auto" else self.tokenizer_spec
            tokenizer = load_tokenizer(spec)
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
            )
        else:
            model, tokenizer = load_pretrained(config.uri)
            if self.tokenizer_spec not in ("auto",):
                tokenizer = load_tokenizer(self.tokenizer_spec)
        for param in model.parameters():
            param.requires_grad_(False)
        return model, tokenizer

    def peft_model(self, adapter: dict[str, torch.Tensor] | None = None) -> Any:
        """The base model wrapped with LoRA; with ``adapter``, those weights are loaded.

        Without ``adapter`` the LoRA weights are freshly initialised from the job seed (the
        initial global adapter).
        """
        if "peft" not in self._cache:
            torch.manual_seed(derive_seed(self.seed, "lora-init"))
            self._cache["peft"] = lora_helpers.apply_lora(
                self.base_model(),
                r=self.lora_config.r,
                alpha=self.lora_config.alpha,
                dropout=self.lora_config.dropout,
                target_modules=self.lora_config.target_modules,
                arch=self.arch,
            )
            self._cache["peft-init"] = lora_helpers.adapter_state(self._cache["peft"])
        model = self._cache["peft"]
        lora_helpers.set_adapter_state(model, adapter if adapter is not None else self._cache["peft-init"])
        model.eval()
        return model

    # -- data -------------------------------------------------------------------------------
    def public_examples(self) -> list[Example]:
        """The provider's public dataset (the job's ``public_data_uri``), read once.

        Raises:
            ConfigError: ``public_data_uri`` is not set, or names nothing readable.
            DataError: A record of the dataset is malformed.
        """
        from fedtune.core.errors import ConfigError, StoreError
        from fedtune.data.loader import read_examples

        if "public" not in self._cache:
            if not self.public_data_uri:
                raise ConfigError(
                    "public_data_uri is not set, but the algorithm trains on a public dataset",
                    fix="Set public_data_uri in the job file to a JSON Lines dataset the provider "
                    "may use (e.g. examples/data/quickstart/public.jsonl).",
                )
            try:
                self._cache["public"] = read_examples(self.public_data_uri)
            except StoreError as exc:
                raise ConfigError(
                    f"public_data_uri={self.public_data_uri!r} cannot be read: {exc}",
                    fix="Point public_data_uri at an existing JSON Lines file or object.",
                ) from exc
        return list(self._cache["public"])

    def encode(self, examples: Sequence[Example]) -> list[dict[str, list[int]]]:
        """Tokenize examples with response-only labels."""
        # Records whose prompt alone exceeds max_seq_len are skipped (and counted in the log).
        return encode_examples(examples, self.tokenizer(), self.training.max_seq_len)

    def train_batches(
        self, encoded: Sequence[dict[str, list[int]]], steps: int, seed: int
    ) -> Iterator[Batch]:
        """``steps`` seeded batches drawn epoch by epoch from ``encoded``."""
        pad_id = self.tokenizer().pad_token_id
        for idx in batch_indices(len(encoded), self.training.batch_size, steps, seed):
            yield collate([encoded[i] for i in idx], pad_id)

    def eval_batches(self, encoded: Sequence[dict[str, list[int]]]) -> Iterator[Batch]:
        """Every held-out example once, in order."""
        pad_id = self.tokenizer().pad_token_id
        size = self.training.batch_size
        for start in range(0, len(encoded), size):
            yield collate(list(encoded[start : start + size]), pad_id)
