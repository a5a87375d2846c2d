"""The tenant's side of the engines: what runs on a tenant's data, in its process or pod.

The tenant's environment, its steps (client step, evaluation, audit) and their dispatch, a
launched pod's exchange by pre-signed URL, its example-level DP-SGD, its secure-aggregation
steps, and the export of a model it keeps. Nothing
here imports provider code (the import-linter contract in pyproject.toml).
"""
