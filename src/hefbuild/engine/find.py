"""Finding a key's result before building it: the local store first (checked as a remote
result is, before anything of it reaches build/), then the remote cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..plan.actions import Action
from ..plan.key import ActionKey
from ..store.outputs import fits_declared
from ..store.store import Record
from .context import Context
from .share import RemoteTier

if TYPE_CHECKING:
    from ..remote.cache import Fetched


class Finder:
    def __init__(self, ctx: Context, remote: RemoteTier) -> None:
        self.ctx, self.remote = ctx, remote

    def local(self, action: Action, key: ActionKey) -> Record | None:
        """The store's result for `key`: its outputs the declared ones, at safe paths, all
        intact; anything else is dropped (a miss, rebuilt)."""
        store = self.ctx.store
        record = store.get_record(key.hex)
        if record is None:
            return None
        if fits_declared(record, action.outputs) and store.intact(record):
            return record
        store.drop_record(key.hex)
        return None

    def remote_hit(self, action: Action, key: ActionKey, lazy: bool = False) -> Fetched | None:
        return self.remote.fetch(action, key, lazy)
