"""Client-level differential privacy (DP-FedAvg, McMahan et al. 2018), one idea per module.

- :mod:`~fedtune.privacy.clipping`: the L2 norm of an adapter delta and its clipping;
- :mod:`~fedtune.privacy.adaptive`: the clip norm's geometric update (Andrew et al. 2021);
- :mod:`~fedtune.privacy.noise`: Gaussian noise from a seed the other party cannot know;
- :mod:`~fedtune.privacy.accountant`: epsilon at delta for the rounds run (``dp-accounting``);
- :mod:`~fedtune.privacy.mechanism`: the tenant's and the provider's halves of one round.

The engine glue (messages, budget stop, summary) is :mod:`fedtune.engines.privacy_steps`.
"""
