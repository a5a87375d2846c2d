"""Kubeflow pipelines: thin components over ``fedtune.entrypoints`` and one pipeline per family.

``run_form`` (the run form and the job it yields) imports no kfp; ``components``, ``builder``
and ``catalog`` do, so import them only where pipelines are compiled.
"""
