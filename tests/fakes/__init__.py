"""Test doubles for hefbuild's I/O boundaries."""
