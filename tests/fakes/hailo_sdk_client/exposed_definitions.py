"""FAKE `hailo_sdk_client.exposed_definitions` (test double)."""

from __future__ import annotations

import enum


class Dims(enum.Enum):
    BATCH = "batch"
    HEIGHT = "height"
    WIDTH = "width"
    CHANNELS = "channels"
