"""Building without the bytes (`[cache] download = "minimal"`): a remote hit leaves its
outputs in the remote cache, and they come into build/ only when something reads them.

Such a hit's folder in build/ holds its `manifest.json` alone. The manifest names every
output with its digest and size, as any manifest does (downstream keys are made of those
digests, so deciding needs no bytes), lists the files that are not in the folder under
`in_remote` (outputs, and `log.txt`), and gives the log's digest and size under `log`.

A file is fetched (from the local store when it holds the object, else from the remote CAS
by digest, verified as it streams in) and linked into the folder under a temporary name,
then renamed; then the manifest is rewritten without it (a temporary file, renamed). A
crash in between leaves a complete file that the manifest still lists as remote; its digest
is checked like any other output's, so nothing half-written is trusted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..digest import Digest
from ..plan.actions import Action
from ..store.events import read_json
from .context import Context
from .install import LOG
from .keys import IN_REMOTE, MANIFEST
from .share import RemoteTier


class Lazy:
    def __init__(self, ctx: Context, tier: RemoteTier) -> None:
        self.ctx, self.tier = ctx, tier
        self.moved = 0  # bytes fetched from the remote cache by this invocation

    def lazy_hit(self, action: Action) -> bool:
        """Whether a remote hit of `action` leaves its bytes in the remote cache: only in
        minimal mode, and never for a check stage (its report is the verdict a run shows)."""
        settings = self.ctx.project.settings.cache
        return settings.minimal and self.ctx.checks.stage_of(action.task) is None

    def materialize(self, action: Action, names: list[str] | None = None,
                    log: bool = False) -> bool:
        """Fetch the stage's outputs that are not in build/ (those named, or all; the log
        too when `log`); False when one could not be had (the caller builds the stage)."""
        folder = self.ctx.paths.root / action.out_dir
        manifest = read_json(folder / MANIFEST)
        if manifest is None or not manifest.get(IN_REMOTE):
            return True
        wanted = [rel for rel in manifest[IN_REMOTE] if (names is None or rel in names)
                  and (rel != LOG or log)]
        blobs = {rel: manifest["log"] if rel == LOG else manifest["outputs"].get(rel)
                 for rel in wanted}
        got: list[str] = []
        ok = True
        with self.ctx.store_lock.shared():  # `doit gc` must not take an object in between
            self._download([b for b in blobs.values() if b is not None])
            for rel in wanted:
                blob = blobs[rel]
                if blob is None or not self._fetch(folder / rel, blob, copy=rel == LOG):
                    ok = False
                    continue
                got.append(rel)
        if got:
            self._rewrite(folder, manifest, got)
            self.ctx.fast.forget(action.out_dir)
        return ok

    def _fetch(self, dest: Path, blob: dict[str, Any], copy: bool) -> bool:
        store, digest = self.ctx.store, str(blob["digest"])
        if os.path.lexists(dest):
            try:
                if self.ctx.stats.digest(dest).hex == digest:
                    return True
            except OSError:
                pass
            dest.unlink()  # not the bytes the manifest names: never kept
        if not store.verify(digest):
            return False  # neither here nor to be had from the remote cache (`_download`)
        tmp = dest.with_name(f".{dest.name}.fetch-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        # The log is copied, as the installer does: an edit of build/'s log must not
        # reach the store's object.
        (store.copy_out if copy else store.materialize)(digest, tmp)
        os.replace(tmp, dest)
        self.ctx.stats.remember(dest, Digest(digest))
        return True

    def _download(self, blobs: list[dict[str, Any]]) -> None:
        """The blobs the local store lacks, from the remote cache, `[cache] transfers` at
        a time (each verified as it streams in; one that fails is simply not there)."""
        store, cache = self.ctx.store, self.tier.cache
        sizes = {str(b["digest"]): int(b["size"]) for b in blobs}
        todo = [(d, size) for d, size in sorted(sizes.items()) if not store.verify(d)]
        if cache is None or not todo:
            return
        from concurrent.futures import ThreadPoolExecutor  # only when blobs move

        workers = min(self.ctx.project.settings.cache.transfers, len(todo))
        with ThreadPoolExecutor(workers, thread_name_prefix="hefbuild-fetch") as pool:
            moved = list(pool.map(lambda item: cache.fetch_blob(*item, store), todo))
        self.moved += sum(n or 0 for n in moved)

    def _rewrite(self, folder: Path, manifest: dict[str, Any], got: list[str]) -> None:
        left = [rel for rel in manifest[IN_REMOTE] if rel not in got]
        doc = {k: v for k, v in manifest.items() if k != IN_REMOTE}
        if left:
            doc[IN_REMOTE] = left
        tmp = folder / f".{MANIFEST}.{os.getpid()}"
        tmp.write_text(json.dumps(doc, sort_keys=True, indent=1))
        os.replace(tmp, folder / MANIFEST)


def in_remote(root: Path, out_dir: str) -> list[str]:
    """What of a stage's result in build/ is in the remote cache only (for the views)."""
    folder = root / out_dir
    manifest = read_json(folder / MANIFEST) or {}
    return [rel for rel in manifest.get(IN_REMOTE, ()) if not os.path.lexists(folder / rel)]
