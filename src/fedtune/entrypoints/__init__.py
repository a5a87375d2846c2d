"""What components and images run: ``python -m fedtune.entrypoints.<step>``.

One module per federated step — ``server_init``, ``configure_round``, ``client_step``,
``aggregate``, ``evaluate``, ``export_and_register`` — each with a ``run`` function that KFP
component bodies call and a ``main`` for pods. Every one parses the job, calls
:mod:`fedtune.engines.steps`, and turns a :class:`~fedtune.core.errors.FedtuneError` into its
message and exit code.
"""
