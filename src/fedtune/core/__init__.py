"""Types, errors and the registry every other package builds on."""
