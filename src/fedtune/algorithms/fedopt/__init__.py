"""FedOPT (FedAdagrad, FedAdam, FedYogi): :mod:`.config` (its section), :mod:`.algorithm`
(the registered class).
"""
