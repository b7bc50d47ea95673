"""FAKE acceleras logger: writes only to `acceleras.log` in the cwd."""

from __future__ import annotations

import logging

_g_logger: logging.Logger | None = None


def default_logger() -> logging.Logger:
    global _g_logger
    if _g_logger is None:
        logger = logging.getLogger("acceleras")
        logger.setLevel(logging.INFO)
        logger.propagate = False
        handler = logging.FileHandler("acceleras.log")
        handler.setFormatter(logging.Formatter("%(asctime)s - %(levelname)s - %(message)s"))
        logger.addHandler(handler)
        _g_logger = logger
    return _g_logger
