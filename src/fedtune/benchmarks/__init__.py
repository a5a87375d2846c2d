"""Benchmarks: a controlled task suite, tiny pretrained base models, quality and system runs.

- :mod:`~fedtune.benchmarks.suite`: non-IID tenants, a drifted public set, held-out tests.
- :mod:`~fedtune.benchmarks.scoring`: greedy exact match per category.
- :mod:`~fedtune.benchmarks.pretrain`: the "large" and "small" base models, from scratch.
- :mod:`~fedtune.benchmarks.quality`: algorithms against their papers' baselines.
- :mod:`~fedtune.benchmarks.system`: client-step speed, engine overhead, bytes, memory.
- :mod:`~fedtune.benchmarks.report`: Markdown tables and PNG plots.

Import from the submodules; this package imports nothing itself.
"""
