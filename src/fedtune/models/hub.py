"""Models and tokenizers named by Hugging Face Hub id, read through the local HF cache.

A job names a hub model as ``hf://org/name`` (optionally ``hf://org/name@revision``) or as
a bare ``org/name``. A bare id is read as a hub id only when no folder of that name exists
beside the job file: a folder that exists wins, so jobs that name ``models/small`` keep
working (:func:`bare_hub_uri`, applied when the job file is read).

The files come from ``huggingface_hub``'s cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``,
else ``~/.cache/huggingface/hub``), layout ``models--org--name/snapshots/<commit>/`` with
``refs/<revision>`` naming the commit. A run downloads what is missing unless
``HF_HUB_OFFLINE=1``; ``validate --deep`` only looks in the cache. Only safetensors,
JSON and tokenizer files are fetched: pickled ``*.bin`` weights never are.
"""

from __future__ import annotations

import os
from pathlib import Path

from fedtune.core.errors import ModelError
from fedtune.models.builtin_bases import base_dir, is_builtin

__all__ = [
    "HUB_SCHEME",
    "bare_hub_uri",
    "cache_folder",
    "describe",
    "hub_references",
    "hub_repo",
    "local_model_path",
]

HUB_SCHEME = "hf://"
# What a model folder needs (config, weights, tokenizer, chat template); never pickles.
_ALLOW = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
_TRUE = {"1", "on", "true", "yes"}


def _valid_repo_id(text: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if text.count("/") != 1:
        return False  # the hub also allows bare "gpt2"; a job must name the owner
    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def bare_hub_uri(value: str, base_dir: Path) -> str | None:
    """``hf://value`` when ``value`` reads as ``org/name`` and ``base_dir/value`` does not
    exist; else ``None`` (a path)."""
    if value.startswith((".", "~", "/")) or not _valid_repo_id(value):
        return None
    return None if (base_dir / value).exists() else HUB_SCHEME + value


def hub_repo(uri: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` of an ``hf://`` URI; ``None`` for any other URI or path.

    Raises:
        ModelError: The URI has the scheme but no valid ``org/name`` after it.
    """
    if not uri.startswith(HUB_SCHEME):
        return None
    repo_id, _, revision = uri[len(HUB_SCHEME) :].partition("@")
    if not _valid_repo_id(repo_id) or (revision == "" and "@" in uri):
        raise ModelError(
            f"{uri!r} is not a Hugging Face model id",
            fix="Write hf://org/name or hf://org/name@revision, e.g. hf://Qwen/Qwen2.5-0.5B.",
        )
    return repo_id, revision or None


def _cache_dir() -> Path:
    # Read when called, not when huggingface_hub is imported, so a process (or test) that
    # sets HF_HUB_CACHE / HF_HOME later is obeyed.
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "huggingface"
    )
    return Path(home) / "hub"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def cache_folder(repo_id: str) -> Path:
    """The cache folder that holds (or will hold) ``repo_id``'s files."""
    from huggingface_hub.file_download import repo_folder_name

    return _cache_dir() / repo_folder_name(repo_id=repo_id, repo_type="model")


def _fetch_fix(repo_id: str, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    return (
        f"Fetch it on a machine with network: `hf download {repo_id}{rev}` (older "
        f"huggingface_hub: `huggingface-cli download {repo_id}{rev}`), with HF_HUB_CACHE or "
        f"HF_HOME pointing at the cache this job reads ({_cache_dir()})."
    )


def local_model_path(uri: str, *, cache_only: bool = False) -> str:
    """The local folder of ``uri``: the cached snapshot of an ``hf://`` id, the package's
    folder of a ``builtin://`` base (:mod:`fedtune.models.builtin_bases`), else ``uri`` as is.

    Args:
        uri: A model or tokenizer URI of the job.
        cache_only: Never download (``validate --deep``); otherwise download only when
            ``HF_HUB_OFFLINE`` is unset.

    Raises:
        ModelError: The id is not in the cache (offline) or cannot be fetched; the message
            names the id and the cache folder, the fix the command that fetches it.
    """
    if is_builtin(uri):
        return base_dir(uri)
    repo = hub_repo(uri)
    if repo is None:
        return uri
    repo_id, revision = repo
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = cache_only or _offline()
    try:
        return str(
            snapshot_download(
                repo_id,
                revision=revision,
                cache_dir=_cache_dir(),
                local_files_only=offline,
                allow_patterns=_ALLOW,
                endpoint=os.environ.get("HF_ENDPOINT") or None,  # a mirror, read when called
            )
        )
    except LocalEntryNotFoundError as exc:
        if _offline():
            where = "looked offline: HF_HUB_OFFLINE=1"
        elif cache_only:
            where = "looked without downloading"
        else:
            where = f"and downloading it failed: {str(exc)[:200]}"
        raise ModelError(
            f"hub model {repo_id!r}{f' at {revision!r}' if revision else ''} is not in the "
            f"Hugging Face cache {str(cache_folder(repo_id))!r} ({where})",
            fix=_fetch_fix(repo_id, revision) + " A bare org/name in a job is a hub id only "
            "when no folder of that name exists beside the job file.",
        ) from exc
    except (HfHubHTTPError, OSError) as exc:
        raise ModelError(
            f"hub model {repo_id!r} cannot be fetched: {exc}",
            fix=f"Check the id and the network. {_fetch_fix(repo_id, revision)}",
        ) from exc


def hub_references(tree: object, path: str = "") -> list[tuple[str, str]]:
    """``(field path, uri)`` of every ``hf://`` string in ``tree`` (a job's ``model_dump()``)."""
    if isinstance(tree, str):
        return [(path, tree)] if tree.startswith(HUB_SCHEME) else []
    if isinstance(tree, dict):
        items = [(f"{path}.{k}" if path else str(k), v) for k, v in tree.items()]
    elif isinstance(tree, list):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(tree)]
    else:
        return []
    return [ref for field, value in items for ref in hub_references(value, field)]


def describe(uri: str) -> str:
    """Where ``uri`` will be read from, for ``fedtune validate`` (looks, never downloads).

    Raises:
        ModelError: ``uri`` has the hub scheme but no valid id.
    """
    repo = hub_repo(uri)
    if not repo:
        return uri
    repo_id, revision = repo
    try:
        found = f"in the cache: {local_model_path(uri, cache_only=True)}"
    except ModelError:
        later = "with HF_HUB_OFFLINE=1 the run fails" if _offline() else "the run downloads it"
        found = f"not in the cache yet ({later}; fetch it with `hf download {repo_id}`)"
    at = f" at {revision}" if revision else ""
    return f"Hugging Face model {repo_id}{at} from {cache_folder(repo_id)}, {found}"
