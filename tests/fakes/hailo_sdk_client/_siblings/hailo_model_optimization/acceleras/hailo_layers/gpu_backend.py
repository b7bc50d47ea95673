"""FAKE optional backend module that cannot be imported here (registration skips it)."""

raise ImportError("FAKE: optional GPU backend not available")
