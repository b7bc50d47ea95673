"""The remote tier behind the local store: Bazel's cache layout, verified before trusted.

What hefbuild writes for one action key (blobs first, the entry last, so a reader never
meets an entry whose blobs were not uploaded):

    cas/<sha256>    each output file, the stage log, and hefbuild's `Record` as JSON
    ac/<key>        a REAPI ActionResult:
                      output_files        every output (path relative to the stage dir),
                                          plus `.hefbuild/record.json`, the Record blob
                      stdout_digest       the stage log
                      execution_metadata  worker (`[cache] worker`, never the hostname
                                          unless asked), execution start/end (integer
                                          nanoseconds), and, when signed, one Any packing
                                          a hefbuild.v1.Signature (remote/signature.proto)

A hit is trusted only after: the entry parses; when trusted keys are configured, it is
signed by one of them over (key, record digest); the record names this key, agrees with
the entry, and names only outputs the stage declares, at safe relative paths; every blob
the local store lacks is present with its declared size, and is streamed into the local
store (stopping at that size) while its SHA-256 is computed. Only then is the record
written to the local store. Anything else is a miss. A broken cache (unreachable, stalled,
401, 5xx, full) is off for the rest of the invocation with one warning; the build goes on.

An upload sends only blobs the cache lacks or holds with the wrong size (or served wrong
bytes for, in this process). An object whose inode changed since the store hashed it is
hashed as it goes: if its bytes no longer match its name it is never sent, and it is removed
from the local store with its record. Readers hash every blob they take, whoever sent it.

Blobs move `[cache] transfers` at a time (default 4), each way, on threads with a connection
of their own: presence checks (one request for all over gRPC), downloads and uploads. The
entry goes last, once every blob it names has arrived; a hit is recorded once all verified.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..store.outputs import fits_declared
from ..store.store import Record, Store
from ..store.upload_queue import UploadQueue
from .cas import BadBlob, BlobStore, WrongBytes, retry
from .fanout import each
from .problems import CorruptSource, Oversized, Problem, RemoteError, Undecodable
from .reapi import (
    SIGNATURE_TYPE,
    ActionResultMessage,
    BlobRef,
    Metadata,
    OutputEntry,
    ReapiDecodeError,
    SignatureMessage,
    decode_action_result,
    encode_action_result,
    encode_signature,
    signatures_of,
)
from .signing import SigningKey, verify_raw
from .transport import Transport, batched, transport_for

RECORD_PATH = ".hefbuild/record.json"
ENTRY_LIMIT = 4 << 20  # an ActionResult of ours is a few KB
RECORD_LIMIT = 16 << 20
T = TypeVar("T")


class _Miss(Exception):
    """This entry cannot be used; `warning` says why when a person should know."""

    def __init__(self, warning: str | None = None) -> None:
        super().__init__(warning or "miss")
        self.warning = warning


@dataclass(frozen=True)
class Fetched:
    record: Record
    bytes: int  # downloaded (blobs already in the local store are not fetched again)
    seconds: float
    log_size: int = 0
    lazy: bool = False  # only checked present: the record is not in the local store


class RemoteCache:
    def __init__(self, settings, warn: Callable[[str], None],  # noqa: ANN001 - CacheSettings
                 transport: Transport | None = None) -> None:
        self.settings = settings
        self.shown = settings.shown
        self._t = transport or transport_for(settings)
        self._blobs = BlobStore(settings, self._t)
        self._warn = warn
        self._off: Problem | None = None
        self._upload_off = not settings.upload
        self._signer = SigningKey.load(settings.signing_key) if settings.signing_key else None
        self.sent = 0

    @property
    def uploading(self) -> bool:
        return self._off is None and not self._upload_off

    # -- reading ---------------------------------------------------------------------

    def fetch(self, key: str, store: Store, task: str,
              declared: tuple[str, ...] | None = None, lazy: bool = False) -> Fetched | None:
        """The verified result of `key`, inserted into `store`; None on any miss.
        `declared`: the stage's outputs, which the record must name exactly. `lazy`: the
        blobs are only checked present with their sizes (HEAD), none is downloaded, and the
        record stays out of the store (which holds only records whose objects it has)."""
        if self._off is not None:
            return None
        start = time.monotonic()
        try:
            raw = self._small(f"ac/{key}", ENTRY_LIMIT)
            if raw is None:
                return None
            record, blobs = self._trusted_record(key, raw, task, declared)
            wanted = {d: size for d, size in blobs.items() if not store.verify(d)}
            self._all_present(wanted, task)
            if lazy:
                return Fetched(record, 0, time.monotonic() - start, blobs[record.log], True)
            got = self._download(sorted(wanted.items()), store, task)
        except _Miss as miss:
            if miss.warning:
                self._warn(f"remote cache {self.shown}: {miss.warning}")
            return None
        except RemoteError as exc:
            self._switch_off(exc, "reading")
            return None
        store.put_record(record)
        return Fetched(record, got, time.monotonic() - start, blobs[record.log])

    def fetch_blob(self, digest: str, size: int, store: Store) -> int | None:
        """One blob by digest into `store`, verified: the bytes moved, or None when the
        cache lacks it, serves other bytes, or is off (the caller builds it instead)."""
        if self._off is not None:
            return None
        try:
            return self._retry(self._blobs.download, digest, store, size)
        except BadBlob as exc:
            self._warn(f"remote cache {self.shown}: {exc}; not trusted, built locally")
        except RemoteError as exc:
            self._switch_off(exc, "reading")
        return None

    def _trusted_record(self, key: str, raw: bytes, task: str,
                        declared: tuple[str, ...] | None) -> tuple[Record, dict[str, int]]:
        try:
            entry = decode_action_result(raw)
        except ReapiDecodeError as exc:
            raise _Miss(f"ac/{key[:12]}… for {task} is not an ActionResult ({exc}); "
                        f"ignored") from exc
        ref = _record_ref(entry)
        if ref is None:
            raise _Miss(f"ac/{key[:12]}… for {task} was not written by hefbuild; ignored")
        self._check_signature(key, entry, ref.hash, task)
        blob = self._record_blob(ref, task)
        actual = hashlib.sha256(blob).hexdigest()
        if actual != ref.hash or len(blob) != ref.size:
            self._blobs.bad.add(ref.hash)
            raise _Miss(_wrong_bytes(ref.hash, actual, task))
        record = _parse_record(blob, key, task)
        if declared is not None and not fits_declared(record, declared):
            raise _Miss(f"the entry for {task} names outputs it does not declare (or unsafe "
                        f"paths); ignored, building locally")
        return record, _blobs_of(record, entry, task)

    def _record_blob(self, ref: BlobRef, task: str) -> bytes:
        if ref.size > RECORD_LIMIT:
            raise _Miss(f"the entry for {task} declares a record of {ref.size} bytes; ignored")
        try:
            blob = self._small(f"cas/{ref.hash}", ref.size)
        except (Oversized, Undecodable) as exc:  # more than its declared size, or not zstd
            self._blobs.bad.add(ref.hash)
            raise _Miss(f"the record blob sha256:{ref.hash} of {task} came wrong ({exc.detail});"
                        f" not trusted, {task} is built locally") from None
        if blob is None:
            raise _Miss()  # evicted: rebuild, and the upload puts it back
        return blob

    def _check_signature(self, key: str, entry: ActionResultMessage, record_digest: str,
                         task: str) -> None:
        trusted = self.settings.trusted_keys
        if not trusted:
            return
        signatures = signatures_of(entry)
        if not signatures:
            raise _Miss(f"the entry for {task} is unsigned; only entries signed by a trusted "
                        f"key are used (ignored, building locally)")
        if not any(verify_raw(s.key_name, s.signature, key, record_digest, trusted)
                   for s in signatures):
            names = ", ".join(s.key_name for s in signatures)
            raise _Miss(f"the entry for {task} is signed by {names!r}, not by a trusted key "
                        f"(ignored, building locally)")

    def _all_present(self, wanted: dict[str, int], task: str) -> None:
        """Every blob there with its declared size, before any is downloaded."""
        items = sorted(wanted.items())
        if batched(self._t) is not None:  # one request; there at another size is absent
            if self._blobs.absent(items):
                raise _Miss()
            return
        sizes = self._each(self._retry, [(self._blobs.size, d) for d, _ in items])
        for (digest, size), there in zip(items, sizes, strict=True):
            if there is None:
                raise _Miss()  # the server evicted it: a miss, never a half restore
            if there >= 0 and there != size:
                self._blobs.bad.add(digest)
                raise _Miss(f"blob sha256:{digest} of {task} is declared as {size} bytes, the "
                            f"cache has {there}; not trusted, {task} is built locally")

    def _download(self, refs: list[tuple[str, int]], store: Store, task: str) -> int:
        try:
            sizes = self._blobs.download_all(refs, store)
        except WrongBytes as exc:
            raise _Miss(_wrong_bytes(exc.expected, exc.actual, task)) from None
        except BadBlob as exc:
            raise _Miss(f"{exc}; not trusted, {task} is built locally") from None
        if None in sizes:
            raise _Miss()
        return sum(size or 0 for size in sizes)

    def _small(self, path: str, limit: int) -> bytes | None:
        def once() -> bytes | None:  # a retry starts from an empty buffer
            parts: list[bytes] = []
            size = self._t.get(path, lambda c: parts.append(bytes(c)), limit)
            return None if size is None else b"".join(parts)

        return self._retry(once)

    # -- writing ---------------------------------------------------------------------

    def upload(self, record: Record, store: Store) -> int | None:
        """Blobs first (only those the cache lacks), the entry last; the bytes sent, or
        None when the result could not be uploaded (it stays queued, or was corrupt)."""
        if not self.uploading:
            return None
        before = self.sent
        try:
            self._upload(record, store)
        except RemoteError as exc:
            self._switch_off(exc, "uploading")
            return None
        except CorruptSource as exc:
            self._drop_corrupt(record, store, exc)
            return None
        UploadQueue(store.root, self.settings.remote).done(record.key)
        return self.sent - before

    def _upload(self, record: Record, store: Store) -> None:
        blob = record.to_json().encode()
        ref = BlobRef(hashlib.sha256(blob).hexdigest(), len(blob))
        entry = self._entry(record, ref, store)
        if self._same_entry_there(record):
            return
        self.sent += self.put_objects(store, sorted(self._absent(
            sorted(_sizes(record, store).items()))))
        # The entry only once every blob it names is there: a reader never sees it first.
        if not self._retry(self._blobs.has, ref.hash, ref.size):
            self.sent += self._retry(self._t.put, f"cas/{ref.hash}", blob, ref.hash)
        self.sent += self._retry(self._t.put, f"ac/{record.key}", encode_action_result(entry))

    def put_objects(self, store: Store, digests: list[str]) -> int:
        """Store objects into the CAS, `transfers` at once; the bytes sent. An object the
        store vouches for goes as it is: it was hashed as it entered the store and its
        inode has not changed since (the trust a local restore gives it). Any other is
        hashed as it is sent, and one that is not its name raises CorruptSource."""
        return sum(self._each(self._retry, [
            (self._t.put, f"cas/{d}", store.object_path(d), None if store.vouched(d) else d)
            for d in digests]))

    def _drop_corrupt(self, record: Record, store: Store, exc: CorruptSource) -> None:
        store.drop_object(exc.expected)
        store.drop_record(record.key)
        UploadQueue(store.root, self.settings.remote).done(record.key)
        self._warn(f"local store object sha256:{exc.expected} of {record.stage} is corrupt "
                   f"(its bytes hash to sha256:{exc.actual[:12]}…): not uploaded to "
                   f"{self.shown}; removed from the store, so the stage is built again")

    def _same_entry_there(self, record: Record) -> bool:
        """An entry for this key with the same outputs, intact and acceptable: keep it."""
        raw = self._small(f"ac/{record.key}", ENTRY_LIMIT)
        if raw is None:
            return False
        try:
            entry = decode_action_result(raw)
        except ReapiDecodeError:
            return False
        outputs = {o.path: o.blob.hash for o in entry.output_files if o.path != RECORD_PATH}
        if outputs != {rel: o.digest for rel, o in record.outputs.items()}:
            return False
        there = _record_ref(entry)  # another runner's record: its timings differ, not outputs
        if there is None or (self._signer is not None and not self._signed_by_us(entry, record)):
            return False
        blobs = {there.hash: there.size, **{o.digest: o.size for o in record.outputs.values()}}
        return not self._absent(sorted(blobs.items()))

    def _signed_by_us(self, entry: ActionResultMessage, record: Record) -> bool:
        assert self._signer is not None
        ref = _record_ref(entry)
        mine = (self._signer.public(),)
        return ref is not None and any(
            verify_raw(s.key_name, s.signature, record.key, ref.hash, mine)
            for s in signatures_of(entry))

    def _entry(self, record: Record, ref: BlobRef, store: Store) -> ActionResultMessage:
        files = tuple(OutputEntry(rel, BlobRef(o.digest, o.size))
                      for rel, o in sorted(record.outputs.items()))
        aux = ()
        if self._signer is not None:
            sig = SignatureMessage(self._signer.name, self._signer.sign_raw(record.key, ref.hash))
            aux = (Metadata(SIGNATURE_TYPE, encode_signature(sig)),)
        log_size = store.object_path(record.log).stat().st_size
        # The record keeps milliseconds: whole nanoseconds from them, never via a float.
        end = round(record.finished_at * 1000) * 1_000_000 if record.finished_at \
            else time.time_ns()
        return ActionResultMessage(
            output_files=files + (OutputEntry(RECORD_PATH, ref),), exit_code=0,
            stdout=BlobRef(record.log, log_size), worker=self.settings.worker,
            execution_start=end - round(record.seconds * 1000) * 1_000_000,
            execution_completed=end, auxiliary=aux)

    # -- transfers -------------------------------------------------------------------

    def _absent(self, items: list[tuple[str, int]]) -> set[str]:
        """The blobs the cache lacks at that size: one request (gRPC), else one HEAD each."""
        if batched(self._t) is not None:
            return self._blobs.absent(items)
        there = self._each(self._retry, [(self._blobs.has, d, size) for d, size in items])
        return {d for (d, _), has in zip(items, there, strict=True) if not has}

    def _each(self, call: Callable[..., T], calls: list[tuple[Any, ...]]) -> list[T]:
        """`call(*args)` for each, up to `transfers` at once, results in order (fanout.py)."""
        return each(call, calls, self.settings.transfers)

    # -- failures --------------------------------------------------------------------

    def _retry(self, call: Callable[..., T], *args: object) -> T:
        return retry(call, *args)

    def _switch_off(self, exc: RemoteError, doing: str) -> None:
        """One warning, then no more requests of that kind in this invocation."""
        if doing == "uploading" and exc.problem in (Problem.UNAUTHORIZED, Problem.FULL):
            self._upload_off = True
            self._warn(f"remote cache {self.shown} {exc}: uploads are off for the rest of "
                       f"this run (results stay in the local store)")
            return
        self._off = exc.problem
        self._warn(f"remote cache {self.shown} {exc} while {doing}; building locally without "
                   f"it for the rest of this run")


def _record_ref(entry: ActionResultMessage) -> BlobRef | None:
    refs = [o.blob for o in entry.output_files if o.path == RECORD_PATH]
    return refs[0] if len(refs) == 1 else None


def _parse_record(blob: bytes, key: str, task: str) -> Record:
    try:
        record = Record.from_json(blob.decode())
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise _Miss(f"the record for {task} does not parse; ignored") from exc
    if record.key != key:
        raise _Miss(f"the entry for {task} holds the result of another key "
                    f"({record.key[:12]}…); ignored")
    return record


def _blobs_of(record: Record, entry: ActionResultMessage, task: str) -> dict[str, int]:
    """Every blob the record names with its size, after checking the entry says the same."""
    listed = {o.path: (o.blob.hash, o.blob.size) for o in entry.output_files
              if o.path != RECORD_PATH}
    mine = {rel: (o.digest, o.size) for rel, o in record.outputs.items()}
    if listed != mine or entry.stdout is None or entry.stdout.hash != record.log:
        raise _Miss(f"the entry for {task} disagrees with its record; ignored")
    blobs: dict[str, int] = {}
    for digest, size in [*mine.values(), (record.log, entry.stdout.size)]:
        if blobs.setdefault(digest, size) != size:
            raise _Miss(f"the entry for {task} gives blob {digest[:12]}… two sizes; ignored")
    return blobs


def _sizes(record: Record, store: Store) -> dict[str, int]:
    """Every blob of the record with its size (the log's from the local store)."""
    sizes = {o.digest: o.size for o in record.outputs.values()}
    sizes[record.log] = store.object_path(record.log).stat().st_size
    return sizes


def _wrong_bytes(expected: str, actual: str, task: str) -> str:
    return (f"blob sha256:{expected} has wrong bytes (they hash to sha256:{actual[:12]}…); "
            f"not trusted, {task} is built locally")
