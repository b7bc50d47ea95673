"""FAKE hailo_model_optimization (test double of the Hailo DFC; see hailo_sdk_client)."""
