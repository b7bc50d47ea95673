"""`doit cache-key NAME [FILE]`: a new Ed25519 key pair for signing remote cache entries."""

from __future__ import annotations

import os
from pathlib import Path

from doit.exceptions import InvalidCommand

from ..errors import HefbuildError
from .command import HelpfulDoitCmd


def default_key_file(name: str) -> Path:
    """Outside every project, so a secret key cannot be committed by accident."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hefbuild" / "keys" / f"{name}.secret"


class CacheKey(HelpfulDoitCmd):
    name = "cache-key"
    doc_purpose = "make a key pair to sign remote cache entries (CI keeps the secret)"
    doc_usage = "NAME [SECRET_KEY_FILE]"
    doc_description = ("Writes the secret key (mode 0600, never overwritten; default "
                       "~/.config/hefbuild/keys/NAME.secret) and prints the public key to put "
                       "in hefbuild.toml [cache] trusted_keys.")
    cmd_options = ()

    def _execute(self, pos_args: list[str] | None = None) -> int:
        from ..remote.signing import generate

        if not pos_args or len(pos_args) > 2:
            raise InvalidCommand("cache-key needs a key name, e.g. `doit cache-key ci-2026`")
        path = Path(pos_args[1]) if len(pos_args) == 2 else default_key_file(pos_args[0])
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            public = generate(pos_args[0], path)
        except HefbuildError as exc:
            self.outstream.write(f"ERROR: {exc}\n")
            return 3
        self.outstream.write(f"secret key: {path} (give it to CI as a secret file; "
                             f"HEFBUILD_SIGNING_KEY=<path>)\npublic key: {public}\n")
        return 0
