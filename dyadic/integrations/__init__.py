"""Adapters between dyadic and inference engines (import-light: no engine is imported)."""
