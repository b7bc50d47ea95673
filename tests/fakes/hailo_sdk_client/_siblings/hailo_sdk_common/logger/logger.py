"""FAKE SDK logger: created lazily like the real one; console + `hailo_sdk.client.log`."""

from __future__ import annotations

import logging
import sys

_g_logger: logging.Logger | None = None


def default_logger() -> logging.Logger:
    global _g_logger
    if _g_logger is None:
        logger = logging.getLogger("hailo_sdk.client")
        logger.setLevel(logging.INFO)
        logger.propagate = False
        fmt = logging.Formatter("[%(levelname)s] %(message)s")
        for handler in (logging.StreamHandler(sys.stdout),
                        logging.FileHandler("hailo_sdk.client.log")):
            handler.setFormatter(fmt)
            logger.addHandler(handler)
        _g_logger = logger
    return _g_logger
