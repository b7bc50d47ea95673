"""The remote tier as the rebuilder uses it: made on first use (sockets and crypto only
then), queried for a key's result, and given every result built here, through the upload
queue in the store so that a `kill -9` between storing and uploading loses nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..plan.actions import Action
from ..plan.key import ActionKey
from ..store.store import Record
from ..store.upload_queue import UploadQueue
from .context import Context

if TYPE_CHECKING:
    from ..remote.cache import Fetched, RemoteCache


class RemoteTier:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._cache: RemoteCache | None | bool = False  # False: not set up yet

    @property
    def cache(self) -> RemoteCache | None:
        if self._cache is False:
            settings = self.ctx.project.settings.cache
            if settings.remote is None:
                self._cache = None
            else:
                from ..remote.cache import RemoteCache  # sockets and crypto only when used

                self._cache = RemoteCache(settings, self.ctx.warn)
        return self._cache or None

    def fetch(self, action: Action, key: ActionKey, lazy: bool = False) -> Fetched | None:
        """The remote cache's verified result, now in the local store (`lazy`: its blobs
        only checked present, engine/lazy.py); None on a miss."""
        cache = self.cache
        if cache is None:
            return None
        return cache.fetch(key.hex, self.ctx.store, action.task, action.outputs, lazy)

    def queue(self, action: Action, key: ActionKey) -> None:
        """Before a result is recorded: a `kill -9` before its upload leaves it queued."""
        settings = self.ctx.project.settings.cache
        if settings.remote is not None and settings.upload:
            UploadQueue(self.ctx.store.root, settings.remote).add(key.hex, action.task)

    def upload(self, record: Record) -> None:
        """After the result is linked in build/ (so pinned against gc), share it."""
        cache = self.cache
        if cache is not None and cache.uploading:
            cache.upload(record, self.ctx.store)

    def flush(self) -> int:
        """Upload what earlier runs stored but did not send (killed, or the cache was
        down); the number of results sent. A no-op costs one folder listing."""
        settings = self.ctx.project.settings.cache
        if settings.remote is None or not settings.upload:
            return 0
        store = self.ctx.store
        queue = UploadQueue(store.root, settings.remote)
        pending = queue.pending()
        cache = self.cache if pending else None
        sent = 0
        for key in pending:
            if cache is None or not cache.uploading:
                break
            record = store.get_record(key)
            if record is None or not store.present(record):
                queue.done(key)  # collected since: nothing to send
                continue
            with self.ctx.store_lock.shared():
                sent += cache.upload(record, store) is not None
        return sent
