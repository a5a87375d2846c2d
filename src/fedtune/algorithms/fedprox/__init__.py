"""FedProx: :mod:`.config` (its section, mu), :mod:`.algorithm` (the registered class)."""
