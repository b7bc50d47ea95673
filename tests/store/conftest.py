"""The store's collection tests use the engine tests' scratch folder and tiny project."""

from engine.conftest import fake, make_engine, root, store, workdir  # noqa: F401
