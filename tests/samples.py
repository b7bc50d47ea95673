"""Tiny declarations the unit tests start from."""

HOST_TOML = '[toolchain]\nkind = "host"\n\n[env]\nPYTHONHASHSEED = "0"\n'
SYNTHETIC = """\
[model]
target = "cpu-ort"

[source.synthetic]
architecture = "llama"
seed = 1
"""
