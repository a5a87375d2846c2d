"""Write MLflow's basic-auth config from the environment, then exec ``mlflow`` with our argv.

MLflow reads the auth database URI only from an ini file (``MLFLOW_AUTH_CONFIG_PATH``). With a
PostgreSQL backend that URI carries a password, so it arrives from a Secret as the environment
variable ``MLFLOW_AUTH_DATABASE_URI`` and is written to the pod's in-memory ``/tmp`` here
instead of into a ConfigMap. The admin password and the Flask key stay in the environment,
where MLflow reads them itself.

Usage (container command): ``python start_mlflow_auth.py server --host=0.0.0.0 ...``
"""

from __future__ import annotations

import configparser
import os
import sys

REQUIRED = ("MLFLOW_AUTH_CONFIG_PATH", "MLFLOW_AUTH_DATABASE_URI", "MLFLOW_AUTH_ADMIN_PASSWORD")


def write_config(path: str, database_uri: str, default_permission: str) -> None:
    """Write the ``[mlflow]`` auth section MLflow's ``read_auth_config`` expects."""
    config = configparser.ConfigParser(interpolation=None)
    config["mlflow"] = {
        "default_permission": default_permission,
        # MLflow reads the file with %-interpolation: a URL-encoded password (%40 ...) must be
        # escaped or the parser fails on it.
        "database_uri": database_uri.replace("%", "%%"),
        "authorization_function": "mlflow.server.auth:authenticate_request_basic_auth",
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        config.write(handle)


def main(argv: list[str]) -> int:
    """Check the environment, write the config and replace this process with mlflow."""
    missing = [name for name in REQUIRED if not os.environ.get(name)]
    if missing:
        sys.stderr.write(
            f"error: environment variables {missing} are empty.\n"
            "fix: set mlflow.auth.existingSecret (keys admin-password, flask-secret-key) and, "
            "with PostgreSQL, the auth-uri key of mlflow.backend.postgresql.existingSecret.\n"
        )
        return 2
    write_config(
        os.environ["MLFLOW_AUTH_CONFIG_PATH"],
        os.environ["MLFLOW_AUTH_DATABASE_URI"],
        os.environ.get("MLFLOW_AUTH_DEFAULT_PERMISSION", "READ"),
    )
    os.execvp("mlflow", ["mlflow", *argv])
    return 0  # not reached: execvp replaces the process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
