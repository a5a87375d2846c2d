"""Promotion of registered models and serving them: KServe manifests and a local server.

- :mod:`~fedtune.serving.refs`: model references (``NAME@ALIAS``, ``NAME/VERSION``) and alias rules.
- :mod:`~fedtune.serving.gate`: the leakage gate a version must pass before promotion.
- :mod:`~fedtune.serving.kserve`: the KServe InferenceService of a promoted version.
- :mod:`~fedtune.serving.schema`: strict validation of that manifest (schema shipped here).
- :mod:`~fedtune.serving.mlflow_registry`: the MLflow model registry (the one mlflow import).
- :mod:`~fedtune.serving.promotion`: ``fedtune promote`` as a function.
- :mod:`~fedtune.serving.local_server`: ``fedtune serve-local``: prompts and a tiny HTTP API.

Importing this package imports neither mlflow nor torch.
"""

from fedtune.serving.gate import AUDIT_TAG, GATE_TAG, LeakageGate
from fedtune.serving.refs import ModelSpec, check_alias, parse_model_spec

__all__ = [
    "AUDIT_TAG",
    "GATE_TAG",
    "LeakageGate",
    "ModelSpec",
    "check_alias",
    "parse_model_spec",
]
