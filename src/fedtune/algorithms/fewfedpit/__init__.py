"""FewFedPIT (paper 004): few-shot tenants grow their data synthetically and leak less.

The section is in :mod:`.config`, the registered class in :mod:`.algorithm`; this package
imports nothing heavy.
"""
