"""Reading what people wrote: model, target and toolchain files, variants, settings
(hefbuild.toml), parameter schemas; every mistake one SpecError line. Pure: imports only
the foundations (errors, digest) and itself.
"""
