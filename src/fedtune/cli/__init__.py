"""The ``fedtune`` command line."""
