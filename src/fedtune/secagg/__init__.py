"""Secure aggregation (SecAgg+, Bonawitz et al. 2017; Bell et al. 2020): the provider learns
only the sum of the tenants' weighted updates.

Pure modules, one idea each: :mod:`fixedpoint` (floats <-> the ring Z_2^64), :mod:`prg`
(masks from a seed), :mod:`keys` (X25519 + HKDF, authenticated share channels), :mod:`identity` (Ed25519
signatures of long-term tenant keys), :mod:`graph` (SecAgg+'s Harary graph), :mod:`messages`,
:mod:`shamir` (threshold sharing of seeds and keys), :mod:`protocol` (the four steps and
unmasking). The engine wiring lives in :mod:`fedtune.engines.tenant.secagg` (tenant) and
:mod:`fedtune.engines.provider.secagg` (provider).
"""
