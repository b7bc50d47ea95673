"""The remote tier behind the local store: Bazel's HTTP cache layout, verified before trusted.

What hefbuild writes for one action key (blobs first, the entry last, so a reader never
meets an entry whose blobs were not uploaded):

    cas/<sha256>    each output file, the stage log, and hefbuild's `Record` as JSON
    ac/<key>        a REAPI ActionResult:
                      output_files        every output (path relative to the stage dir),
                                          plus `.hefbuild/record.json`, the Record blob
                      stdout_digest       the stage log
                      execution_metadata  worker, execution start/end, and, when signed,
                                          one Any {SIGNATURE_TYPE, b"name:BASE64"}

A hit is trusted only after: the entry parses; when trusted keys are configured, it is
signed by one of them over (key, record digest); the record names this key and agrees
with the entry; and every blob is streamed into the local store while its SHA-256 is
computed. Anything else is a miss. A broken cache (unreachable, slow, 401, 5xx, full)
is switched off for the rest of the invocation with one warning; the build goes on.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..store import Record, Store
from .cas import BlobStore, WrongBytes, retry
from .reapi import (
    ActionResultMessage,
    BlobRef,
    Metadata,
    OutputEntry,
    ReapiDecodeError,
    decode_action_result,
    encode_action_result,
)
from .signing import SigningKey, verify
from .transport import Problem, RemoteError, Transport, transport_for

RECORD_PATH = ".hefbuild/record.json"
SIGNATURE_TYPE = "type.hefbuild.dev/hefbuild.v1.Signature"
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

    def fetch(self, key: str, store: Store, task: str) -> Fetched | None:
        """The verified result of `key`, inserted into `store`; None on any miss."""
        if self._off is not None:
            return None
        start = time.monotonic()
        try:
            raw = self._small(f"ac/{key}", ENTRY_LIMIT)
            if raw is None:
                return None
            record, blobs = self._trusted_record(key, raw, task)
            wanted = {d: size for d, size in blobs.items() if not store.verify(d)}
            self._all_present(wanted, task)
            got = sum(self._download(d, store, task) for d in sorted(wanted))
        except _Miss as miss:
            if miss.warning:
                self._warn(f"remote cache {self.shown}: {miss.warning}")
            return None
        except RemoteError as exc:
            self._switch_off(exc, "reading")
            return None
        store.put_record(record)
        return Fetched(record, got, time.monotonic() - start)

    def _trusted_record(self, key: str, raw: bytes, task: str) -> tuple[Record, dict[str, int]]:
        try:
            entry = decode_action_result(raw)
        except ReapiDecodeError as exc:
            raise _Miss(f"ac/{key[:12]}… for {task} is not an ActionResult ({exc}); "
                        f"ignored") from exc
        ref = _record_ref(entry)
        if ref is None:
            raise _Miss(f"ac/{key[:12]}… for {task} was not written by hefbuild; ignored")
        self._check_signature(key, entry, ref.hash, task)
        blob = self._small(f"cas/{ref.hash}", RECORD_LIMIT)
        if blob is None:
            raise _Miss()  # evicted: rebuild, and the upload puts it back
        actual = hashlib.sha256(blob).hexdigest()
        if actual != ref.hash:
            raise _Miss(_wrong_bytes(ref.hash, actual, task))
        record = _parse_record(blob, key, task)
        return record, _blobs_of(record, entry, task)

    def _check_signature(self, key: str, entry: ActionResultMessage, record_digest: str,
                         task: str) -> None:
        trusted = self.settings.trusted_keys
        if not trusted:
            return
        signatures = [m.value.decode(errors="replace") for m in entry.auxiliary
                      if m.type_url == SIGNATURE_TYPE]
        if not signatures:
            raise _Miss(f"the entry for {task} is unsigned; only entries signed by a trusted "
                        f"key are used (ignored, building locally)")
        if not any(verify(s, key, record_digest, trusted) for s in signatures):
            names = ", ".join(s.partition(":")[0] for s in signatures)
            raise _Miss(f"the entry for {task} is signed by {names!r}, not by a trusted key "
                        f"(ignored, building locally)")

    def _all_present(self, wanted: dict[str, int], task: str) -> None:
        for digest in sorted(wanted):
            if not self._retry(self._t.head, f"cas/{digest}"):
                raise _Miss()  # the server evicted it: a miss, never a half restore

    def _download(self, digest: str, store: Store, task: str) -> int:
        try:
            size = self._blobs.download(digest, store)
        except WrongBytes as exc:
            raise _Miss(_wrong_bytes(exc.expected, exc.actual, task)) from None
        if size is None:
            raise _Miss()
        return size

    def _small(self, path: str, limit: int) -> bytes | None:
        def once() -> bytes | None:  # a retry starts from an empty buffer
            parts: list[bytes] = []
            size = self._t.get(path, lambda c: parts.append(bytes(c)), limit)
            return None if size is None else b"".join(parts)

        return self._retry(once)

    # -- writing ---------------------------------------------------------------------

    def upload(self, record: Record, store: Store) -> int:
        """Blobs first (only the missing ones), the entry last; returns bytes sent."""
        if not self.uploading:
            return 0
        before = self.sent
        try:
            blob = record.to_json().encode()
            ref = BlobRef(hashlib.sha256(blob).hexdigest(), len(blob))
            entry = self._entry(record, ref, store)
            if self._same_entry_there(record, ref.hash):
                return 0
            for digest in sorted(_digests(record)):
                self._put_missing(digest, store)
            if not self._retry(self._t.head, f"cas/{ref.hash}"):
                self.sent += self._retry(self._t.put, f"cas/{ref.hash}", blob)
            self.sent += self._retry(self._t.put, f"ac/{record.key}", encode_action_result(entry))
        except RemoteError as exc:
            self._switch_off(exc, "uploading")
        return self.sent - before

    def _put_missing(self, digest: str, store: Store) -> None:
        if not self._retry(self._t.head, f"cas/{digest}"):
            self.sent += self._retry(self._t.put, f"cas/{digest}", store.object_path(digest))

    def _same_entry_there(self, record: Record, record_digest: str) -> bool:
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
        ref = _record_ref(entry)
        if ref is None or (self._signer is not None and not self._signed_by_us(entry, record)):
            return False
        blobs = [ref.hash, *_digests(record)]
        return all(self._retry(self._t.head, f"cas/{d}") for d in blobs)

    def _signed_by_us(self, entry: ActionResultMessage, record: Record) -> bool:
        assert self._signer is not None
        ref = _record_ref(entry)
        mine = (self._signer.public(),)
        return ref is not None and any(
            verify(m.value.decode(errors="replace"), record.key, ref.hash, mine)
            for m in entry.auxiliary if m.type_url == SIGNATURE_TYPE)

    def _entry(self, record: Record, ref: BlobRef, store: Store) -> ActionResultMessage:
        files = tuple(OutputEntry(rel, BlobRef(o.digest, o.size))
                      for rel, o in sorted(record.outputs.items()))
        aux = ()
        if self._signer is not None:
            aux = (Metadata(SIGNATURE_TYPE, self._signer.sign(record.key, ref.hash).encode()),)
        log_size = store.object_path(record.log).stat().st_size
        end = record.finished_at or time.time()
        return ActionResultMessage(
            output_files=files + (OutputEntry(RECORD_PATH, ref),), exit_code=0,
            stdout=BlobRef(record.log, log_size), worker=socket.gethostname(),
            execution_start=end - record.seconds, execution_completed=end, auxiliary=aux)

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
    except (UnicodeDecodeError, ValueError, TypeError, KeyError) as exc:
        raise _Miss(f"the record for {task} does not parse; ignored") from exc
    if record.key != key:
        raise _Miss(f"the entry for {task} holds the result of another key "
                    f"({record.key[:12]}…); ignored")
    return record


def _blobs_of(record: Record, entry: ActionResultMessage, task: str) -> dict[str, int]:
    """Every blob the record names, after checking the entry says the same."""
    listed = {o.path: (o.blob.hash, o.blob.size) for o in entry.output_files
              if o.path != RECORD_PATH}
    mine = {rel: (o.digest, o.size) for rel, o in record.outputs.items()}
    if listed != mine or entry.stdout is None or entry.stdout.hash != record.log:
        raise _Miss(f"the entry for {task} disagrees with its record; ignored")
    blobs = {digest: size for digest, size in mine.values()}
    blobs[record.log] = entry.stdout.size
    return blobs


def _digests(record: Record) -> set[str]:
    return {o.digest for o in record.outputs.values()} | {record.log}


def _wrong_bytes(expected: str, actual: str, task: str) -> str:
    return (f"blob sha256:{expected} has wrong bytes (they hash to sha256:{actual[:12]}…); "
            f"not trusted, {task} is built locally")
