"""FAKE `hailo_platform.genai` (test double; see the package docstring). NOT the real runtime."""

from __future__ import annotations

from hailo_platform.pyhailort.pyhailort import LLM, VDevice

__all__ = ["LLM", "VDevice"]
