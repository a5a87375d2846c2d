"""Test helpers shared across test folders (import as ``tests.helpers.<module>``)."""
