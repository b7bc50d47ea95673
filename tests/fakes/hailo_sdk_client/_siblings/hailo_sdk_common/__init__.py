"""FAKE `hailo_sdk_common` (test double of the Hailo DFC; see hailo_sdk_client)."""
