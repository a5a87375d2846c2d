"""The Kubernetes Secrets the provider's pipeline pods read, and which key becomes which variable.

One place for names that the Helm chart, its NOTES and README, ``fedtune compile`` /
``fedtune submit`` defaults and the compiled pipelines must agree on (a test checks they do).
Only names live here; the values stay in the cluster and reach a pod as environment
variables through ``secretKeyRef``, never through fedtune.
"""

from __future__ import annotations

from typing import Final

# The presigner's variables: defined by the store that reads them (storage knows no job
# config), named here with the rest.
from fedtune.storage.s3 import PRESIGNER_ENV as PRESIGNER_ENV

PROVIDER_S3_SECRET: Final = "fedtune-s3"
"""The provider's object-store credentials (the chart's ``objectStore.existingSecret``)."""

S3_SECRET_ENV: Final[dict[str, str]] = {
    "access-key-id": "AWS_ACCESS_KEY_ID",
    "secret-access-key": "AWS_SECRET_ACCESS_KEY",
}
"""Key of an S3 credentials Secret -> the variable boto3 reads."""

PRESIGNER_SECRET: Final = "fedtune-presigner"
"""Keys of the least-privilege object-store user that signs tenants' URLs (the chart's
``objectStore.presignerSecret``; with MinIO the bucket bootstrap creates that user)."""

MLFLOW_SECRET: Final = "fedtune-mlflow-pipeline"
"""MLflow login of pipeline pods when the chart's MLflow basic auth is on (the chart's
``mlflow.auth.pipelineSecret``; the bucket bootstrap creates that MLflow user)."""

MLFLOW_SECRET_ENV: Final[dict[str, str]] = {
    "username": "MLFLOW_TRACKING_USERNAME",
    "password": "MLFLOW_TRACKING_PASSWORD",
}
"""Key of the MLflow Secret -> the variable the MLflow client reads."""
