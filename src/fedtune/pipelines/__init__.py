"""Kubeflow pipelines: thin components over ``fedtune.entrypoints`` and one pipeline per job.

``plan`` (the unrolled shape and its size bound) imports no kfp; ``components``, ``builder``
and ``catalog`` do, so import them only where pipelines are compiled.
"""
