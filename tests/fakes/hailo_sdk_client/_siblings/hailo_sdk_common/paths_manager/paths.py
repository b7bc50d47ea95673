"""FAKE SDKPaths singleton: a non-release install whose build dir does not exist."""

from __future__ import annotations


class SDKPaths:
    HAILO_TEMP_DIR_PREFIX = "hailo_fake_build_"
    _instance: SDKPaths | None = None

    def __new__(cls) -> SDKPaths:
        if cls._instance is None:
            inst = super().__new__(cls)
            inst._is_release = False
            inst._build_dir = "/nonexistent/fake-hailo-sdk-build"
            cls._instance = inst
        return cls._instance

    @property
    def is_release(self) -> bool:
        return self._is_release

    @property
    def build_dir(self) -> str:
        return self._build_dir
