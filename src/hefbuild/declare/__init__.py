"""declare."""
