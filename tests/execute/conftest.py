"""The host executor's tests run real rules on the tiny project of the engine's tests."""

from engine.conftest import fake, make_engine, root, store, workdir  # noqa: F401
