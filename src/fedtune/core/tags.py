"""Tags on exported models that more than one layer reads (algorithms set them, the registry
carries them, whoever promotes or shares a version checks them)."""

from __future__ import annotations

from typing import Final

#: Artifact tag marking a model that must never be shared with tenants (e.g. FedBiOT's AdapFu,
#: which holds E*). Every export stays in the provider-private store; the tag travels to the
#: registry so that whoever promotes or shares a version sees it.
PROVIDER_ONLY_TAG: Final = "provider_only"
