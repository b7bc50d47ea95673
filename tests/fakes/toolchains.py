"""Toolchain files that point a project's stages at the test doubles in tests/fakes."""

from __future__ import annotations

from pathlib import Path

FAKES = Path(__file__).resolve().parent

# `toolchain/hailo-dfc-5.3.0.toml` for tests: the DFC stages run on the host with the
# hailo_sdk_client double first on the path (its outputs say FAKE).
FAKE_DFC_TOOLCHAIN = f"""\
[toolchain]
kind = "host"
description = "the DFC test double (tests/fakes/hailo_sdk_client)"

[env]
PYTHONPATH = "{FAKES}"
NPY_PROMOTION_STATE = "legacy"
CUDA_VISIBLE_DEVICES = "0"
"""
