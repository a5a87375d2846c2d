"""SCAFFOLD: :mod:`.config` (its section), :mod:`.algorithm` (the registered class)."""
