"""Helpers shared by hefbuild stage rules (each imported module is part of a rule's cache key)."""
