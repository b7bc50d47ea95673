"""FAKE `hailo_platform.pyhailort` (test double). NOT the real runtime."""
