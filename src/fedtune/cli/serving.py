"""Subcommands ``promote`` and ``serve-local``: from a registered model to something serving."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from fedtune.serving.gate import AUDIT_TAG, GATE_TAG, LeakageGate

out = Console(highlight=False)

PROMOTE_EPILOG = f"""\
leakage gate:
  The gate is on when --max-leakage is given or the registered model has the tag
  {GATE_TAG}; the version must then carry the tag {AUDIT_TAG} (mean Rouge-L of
  the memorization audit, 0..1) with a value at most that bound. --require-audit demands the
  tag even without a bound.

examples:
  fedtune promote quickstart --version 3 --alias champion
  fedtune promote quickstart --version 3 --alias champion --max-leakage 0.3 \\
      --kserve-out isvc.yaml --artifacts-destination s3://fedtune-mlflow/artifacts \\
      --namespace fedtune-serving
"""


def _promote(args: argparse.Namespace) -> int:
    from fedtune.serving.kserve import KServeOptions
    from fedtune.serving.mlflow_registry import ModelRegistry
    from fedtune.serving.promotion import PromotionRequest, promote
    from fedtune.serving.refs import check_alias, check_version

    gate = LeakageGate(max_leakage=args.max_leakage, require_audit=args.require_audit)
    request = PromotionRequest(
        name=args.name,
        version=args.version,
        alias=args.alias,
        gate=gate,
        kserve_out=Path(args.kserve_out) if args.kserve_out else None,
        kserve=KServeOptions(
            name=args.isvc_name,
            namespace=args.namespace,
            runtime=args.runtime,
            service_account=args.service_account,
            gpus=args.gpus,
            lora=args.lora,
        ),
        artifacts_destination=args.artifacts_destination,
    )
    # Options are checked before connecting: a typo should not wait for the network.
    check_alias(request.alias)
    check_version(request.version)
    result = promote(ModelRegistry.connect(args.tracking_uri), request)
    if result.previous_version is None:
        moved = "(new alias)"
    elif result.previous_version == result.version:
        moved = "(already there)"
    else:
        moved = f"(was version {result.previous_version})"
    out.print(
        Text(f"{result.name}@{result.alias} -> version {result.version} {moved}"), soft_wrap=True
    )
    out.print(Text(result.gate.describe()), soft_wrap=True)
    if result.inferenceservice is not None and result.kserve_out is not None:
        uri = result.inferenceservice["spec"]["predictor"]["model"]["storageUri"]
        out.print(
            Text(f"InferenceService: {result.kserve_out}  (storageUri {uri})"), soft_wrap=True
        )
        out.print(Text(f"apply it with: kubectl apply -f {result.kserve_out}"), soft_wrap=True)
    return 0


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def register_promote(sub: Any) -> None:
    """Add ``fedtune promote``."""
    p = sub.add_parser(
        "promote",
        help="move a registry alias to a model version (leakage gate, KServe manifest)",
        description="Point ALIAS of registered model NAME at VERSION, after the leakage gate "
        "passes, and optionally write the KServe InferenceService that serves it from its "
        "physical artifact location. Nothing changes unless every check passes.",
        epilog=PROMOTE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", help="registered model name")
    p.add_argument("--version", required=True, help="version number to promote")
    p.add_argument("--alias", default="champion", help="alias to move (default: champion)")
    p.add_argument(
        "--tracking-uri",
        help="MLflow URI (default: MLFLOW_TRACKING_URI, else sqlite:///.fedtune/mlflow.db)",
    )
    gate = p.add_argument_group("leakage gate")
    gate.add_argument(
        "--max-leakage",
        type=float,
        metavar="X",
        help=f"highest acceptable {AUDIT_TAG} (overrides the model's {GATE_TAG})",
    )
    gate.add_argument(
        "--require-audit",
        action="store_true",
        help="refuse a version without an audit result even with no threshold",
    )
    kserve = p.add_argument_group("KServe InferenceService")
    kserve.add_argument("--kserve-out", metavar="FILE", help="write the InferenceService YAML here")
    kserve.add_argument(
        "--artifacts-destination",
        metavar="URI",
        help="the MLflow server's --artifacts-destination, to translate proxied "
        "mlflow-artifacts: locations (e.g. s3://fedtune-mlflow/artifacts)",
    )
    kserve.add_argument("--isvc-name", help="InferenceService name (default: <name>-<alias>)")
    kserve.add_argument("--namespace", help="namespace of the InferenceService")
    kserve.add_argument("--runtime", help="ServingRuntime (default: KServe picks for huggingface)")
    kserve.add_argument("--service-account", help="predictor ServiceAccount (storage credentials)")
    kserve.add_argument(
        "--gpus", type=_non_negative, default=1, help="GPUs per predictor (default 1)"
    )
    kserve.add_argument(
        "--lora",
        action="store_true",
        help="also serve adapter/ with vLLM LoRA (Llama only; for versions whose "
        "top-level weights are the un-merged base)",
    )
    p.set_defaults(handler=_promote)


def _serve_local(args: argparse.Namespace) -> int:
    from fedtune.core.errors import ConfigError
    from fedtune.serving.local_server import (
        LocalServer,
        check_max_new_tokens,
        load_generator,
    )
    from fedtune.serving.mlflow_registry import ModelRegistry
    from fedtune.serving.refs import parse_model_spec

    spec = parse_model_spec(args.model)
    check_max_new_tokens(args.max_new_tokens, "--max-new-tokens")
    if not args.prompt and args.port is None:
        raise ConfigError(
            "nothing to serve: no --prompt and no --port",
            fix="Pass --prompt TEXT (repeatable) to answer prompts, or --port N (0 for any "
            "free port) to serve HTTP on 127.0.0.1.",
        )
    registry = ModelRegistry.connect(args.tracking_uri)
    with tempfile.TemporaryDirectory(prefix="fedtune-serve-") as tmp:
        generate = load_generator(registry, spec, Path(tmp))
        for prompt in args.prompt or []:
            text = generate(prompt, args.max_new_tokens)
            if args.json:
                sys.stdout.write(json.dumps({"prompt": prompt, "text": text}) + "\n")
                sys.stdout.flush()
            else:
                out.print(Text(f"> {prompt}", style="dim"), soft_wrap=True)
                out.print(Text(text), soft_wrap=True)
        if args.port is not None:
            server = LocalServer(
                generate,
                str(spec),
                port=args.port,
                max_new_tokens=args.max_new_tokens,
                max_requests=args.max_requests,
            )
            out.print(
                Text(f"serving {spec} on {server.url}  (POST /v1/completions, GET /health)"),
                soft_wrap=True,
            )
            try:
                server.serve()
            except KeyboardInterrupt:
                out.print("stopped")
    return 0


def register_serve_local(sub: Any) -> None:
    """Add ``fedtune serve-local``."""
    p = sub.add_parser(
        "serve-local",
        help="answer prompts with a registered model, here (CLI or HTTP on 127.0.0.1)",
        description="Load MODEL (NAME@ALIAS or NAME/VERSION) from the MLflow registry and "
        "answer prompts greedily: each --prompt is answered on stdout; with --port, a JSON "
        "OpenAI-compatible endpoint on 127.0.0.1 (FastAPI on uvicorn) answers POST "
        '/v1/completions {"prompt": ..., "max_tokens": N} with {"choices": [{"text": ...}]}, '
        "GET /v1/models and GET /health.",
    )
    p.add_argument("model", help="NAME@ALIAS or NAME/VERSION, e.g. quickstart@champion")
    p.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt (repeatable)")
    p.add_argument("--port", type=int, help="serve HTTP on 127.0.0.1:PORT (0: any free port)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (default 32)")
    p.add_argument(
        "--json",
        action="store_true",
        help='print one JSON line {"prompt": ..., "text": ...} per prompt',
    )
    p.add_argument(
        "--max-requests",
        type=int,
        metavar="N",
        help="stop serving after N HTTP requests (smoke tests)",
    )
    p.add_argument(
        "--tracking-uri",
        help="MLflow URI (default: MLFLOW_TRACKING_URI, else sqlite:///.fedtune/mlflow.db)",
    )
    p.set_defaults(handler=_serve_local)


def register_serving(sub: Any) -> None:
    """Add ``promote`` and ``serve-local``."""
    register_promote(sub)
    register_serve_local(sub)
