"""Load and save Hugging Face format model directories, safetensors only.

A model directory holds ``config.json``, safetensors weights (one file or an index plus
shards) and, usually, the tokenizer files. It may live on local disk (a path or ``file://``)
or in an object store (``s3://``), from which it is copied to a temporary folder first.
Pickled ``*.bin`` weights are refused: loading them runs code chosen by whoever wrote them.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from fedtune.core.errors import ModelError
from fedtune.models.hub import local_model_path
from fedtune.models.prompt_frame import PROMPT_FILE
from fedtune.models.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
ADAPTER_SUBDIR = "adapter"  # an export's LoRA adapter, applied on top of the base weights
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
JOB_FIELD = "model.uri"  # what names a model directory unless the caller says otherwise
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")


def load_pretrained(
    path_or_uri: str,
    *,
    tokenizer: str | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a Hugging Face format directory.

    Args:
        path_or_uri: A local path, ``file://``, ``s3://`` or ``hf://`` URI of the directory
            (``hf://org/name``: the Hugging Face cache's snapshot, :mod:`fedtune.models.hub`).
        tokenizer: ``None`` to use the directory's own tokenizer, else a spec for
            :func:`fedtune.models.tokenizer.load_tokenizer` (``"builtin"`` or a path).
        dtype: Parameter dtype; ``None`` keeps the checkpoint's.

    Returns:
        The model in eval mode, and the tokenizer.

    Raises:
        ModelError: The directory is missing, lacks ``config.json``, safetensors weights or a
            tokenizer, or its contents fail to load.
    """
    if path_or_uri.startswith("s3://"):
        with tempfile.TemporaryDirectory(prefix="fedtune-model-") as tmp:
            local = Path(tmp)
            _download_dir(path_or_uri, local)
            return _load_local(local, shown=path_or_uri, tokenizer=tokenizer, dtype=dtype)
    local = Path(local_model_path(path_or_uri).removeprefix("file://"))
    return _load_local(local, shown=path_or_uri, tokenizer=tokenizer, dtype=dtype)


def load_exported(
    path_or_uri: str, *, named: str = JOB_FIELD
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Load a model directory as fedtune exports it: base weights, plus ``adapter/`` if present.

    Args:
        path_or_uri: A local path, ``file://`` URI or ``s3://`` URI of the directory.
        named: What gave the directory, for the errors' fixes (a command's ``MODEL``).

    Raises:
        ModelError: As :func:`load_pretrained`, or the ``adapter/`` folder is incomplete.
    """
    if path_or_uri.startswith("s3://"):
        with tempfile.TemporaryDirectory(prefix="fedtune-model-") as tmp:
            _download_dir(path_or_uri, Path(tmp))
            return _with_adapter(Path(tmp), shown=path_or_uri, named=named)
    local = local_model_path(path_or_uri).removeprefix("file://")
    return _with_adapter(Path(local), shown=path_or_uri, named=named)


def _with_adapter(
    path: Path, *, shown: str, named: str
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    from fedtune.models.lora import load_adapter  # lora imports this module

    model, tokenizer = _load_local(path, shown=shown, tokenizer=None, dtype=None, named=named)
    if (path / ADAPTER_SUBDIR).is_dir():
        return load_adapter(model, path / ADAPTER_SUBDIR), tokenizer
    return model, tokenizer


def load_pretrained_from_store(
    store: Any, *, shown: str, tokenizer: str | None = None, dtype: torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """:func:`load_pretrained` of the model directory that ``store`` (a Store) holds, e.g. a
    tenant's own store confined to the model's prefix."""
    with tempfile.TemporaryDirectory(prefix="fedtune-model-") as tmp:
        download_store_dir(store, Path(tmp), shown=shown)
        return _load_local(Path(tmp), shown=shown, tokenizer=tokenizer, dtype=dtype)


def _download_dir(uri: str, dest: Path) -> None:
    """Copy every object under the store prefix ``uri`` into ``dest``, keeping relative keys."""
    # Imported here: storage pulls in boto3 only for s3://, and local loads need none of it.
    from fedtune.storage import open_store

    download_store_dir(open_store(uri), dest, shown=uri)


def download_store_dir(store: Any, dest: Path, *, shown: str) -> None:
    """Copy every object of ``store`` (a Store) into ``dest``, keeping relative keys.

    Raises:
        ModelError: The store holds nothing, or a key would land outside ``dest``.
    """
    uri = shown
    keys = store.list()
    if not keys:
        raise ModelError(
            f"no model files found under {uri!r} (the store lists only objects that have a "
            "'.sha256' sidecar)",
            fix="Upload the model directory with its checksums (fedtune's store writes them), "
            "or check the URI.",
        )
    root = dest.resolve()
    for key in keys:
        target = (root / key).resolve()
        # The store validates keys already; this keeps a bad key from writing outside dest.
        if not target.is_relative_to(root):
            raise ModelError(f"object key {key!r} under {uri!r} escapes the download folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        # A sidecar that exists is checked either way; verify=False also accepts objects that
        # people uploaded without one.
        target.write_bytes(store.get_bytes(key, verify=False))
    logger.info("copied %d objects of %s to %s", len(keys), uri, dest)


def _describe_contents(path: Path) -> str:
    names = sorted(p.name for p in path.iterdir())
    return ", ".join(names) if names else "nothing"


def check_model_dir(path: Path, *, shown: str | None = None, named: str = JOB_FIELD) -> None:
    """Raise ModelError unless ``path`` holds ``config.json`` and safetensors weights.

    ``named`` is what gave the directory (the job's ``model.uri``, a command's ``MODEL``).
    """
    shown = shown or str(path)
    fix = f"Point {named} at a folder written by save_pretrained (config.json + weights)."
    if not path.is_dir():
        raise ModelError(
            f"model directory {shown!r} does not exist or is not a directory", fix=fix
        )
    found = _describe_contents(path)
    if not (path / CONFIG_FILE).is_file():
        raise ModelError(f"model directory {shown!r} has no {CONFIG_FILE} (found: {found})", fix=fix)
    if not any((path / name).is_file() for name in SAFE_WEIGHTS):
        pickled = [name for name in PICKLE_WEIGHTS if (path / name).is_file()]
        if pickled:
            raise ModelError(
                f"model directory {shown!r} has only pickled weights {pickled} (found: {found})",
                fix="Convert the weights to safetensors (load and save_pretrained once in a "
                "trusted environment); fedtune never unpickles model files.",
            )
        raise ModelError(
            f"model directory {shown!r} has no weights: expected one of {list(SAFE_WEIGHTS)} "
            f"(found: {found})",
            fix="Copy the model's safetensors files into the directory.",
        )


def _load_local(
    path: Path,
    *,
    shown: str,
    tokenizer: str | None,
    dtype: torch.dtype | None,
    named: str = JOB_FIELD,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    check_model_dir(path, shown=shown, named=named)
    if tokenizer is None and not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelError(
            f"model directory {shown!r} has no tokenizer files (found: {_describe_contents(path)})",
            fix="Save the tokenizer into the directory (tokenizer.save_pretrained)"
            + (", or set the job's tokenizer explicitly." if named == JOB_FIELD else "."),
        )
    # Without dtype, transformers 5 keeps the checkpoint's dtype.
    extra = {"dtype": dtype} if dtype is not None else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path),
            use_safetensors=True,
            local_files_only=True,
            trust_remote_code=False,
            **extra,
        )
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as exc:
        raise ModelError(
            f"cannot load the model in {shown!r}: {exc}",
            fix="Check that config.json and the weights belong together and are complete.",
        ) from exc
    model.eval()  # type: ignore[no-untyped-call]
    tok = load_tokenizer(tokenizer if tokenizer is not None else str(path))
    logger.info("loaded %s from %s", type(model).__name__, shown)
    return model, tok


def save_pretrained_dir(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path
) -> Path:
    """Write ``model`` (safetensors) and ``tokenizer`` as a Hugging Face directory.

    Raises:
        ModelError: ``model`` is a PEFT model (export it with ``merge_and_export`` or
            ``save_adapter`` instead), or the save produced pickled weights.
    """
    if isinstance(model, PeftModel):
        raise ModelError(
            "save_pretrained_dir got a PEFT model, which would save only its adapter",
            fix="Use fedtune.models.lora.merge_and_export (full model) or save_adapter.",
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _no_deepspeed_probe():
        model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    write_prompt_template(out)
    # transformers 5 writes safetensors only; check, since a pickle here would cross to tenants.
    pickled = sorted(p.name for p in out.glob("*.bin"))
    if pickled:
        raise ModelError(
            f"saving to {str(out)!r} wrote pickled files {pickled}",
            fix="Upgrade transformers to >= 5, which saves safetensors only.",
        )
    logger.info("saved %s to %s", type(model).__name__, out)
    return out


def write_prompt_template(out: Path) -> None:
    """Write :data:`~fedtune.models.prompt_frame.PROMPT_FILE`; the serving code formats each
    request's prompt with it (:mod:`fedtune.models.prompt_frame`, shipped with the model)."""
    from fedtune.data.templates import ALPACA_PROMPT_NO_INPUT

    text = json.dumps({"template": ALPACA_PROMPT_NO_INPUT, "field": "instruction"}, indent=2)
    (out / PROMPT_FILE).write_text(text + "\n", encoding="utf-8")


@contextmanager
def _no_deepspeed_probe() -> Iterator[None]:
    """Keep ``save_pretrained`` from importing DeepSpeed (seconds, and MLflow with it).

    transformers unwraps the model with accelerate, which imports DeepSpeed whenever it is
    installed, only to test ``isinstance(model, DeepSpeedEngine)``. A model can be wrapped in
    that engine only once DeepSpeed is imported, so the probe is answered from ``sys.modules``
    for the duration of the save; a run that trains with DeepSpeed still gets the real test.
    """
    try:
        from accelerate.utils import other
    except ImportError:  # pragma: no cover - transformers then unwraps without accelerate
        yield
        return
    probe = other.is_deepspeed_available
    other.is_deepspeed_available = lambda: "deepspeed" in sys.modules and probe()
    try:
        yield
    finally:
        other.is_deepspeed_available = probe
