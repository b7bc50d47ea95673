"""Project settings: `hefbuild.toml` at the project root, overridden by the environment.

Settings say where results are shared and who may write them; they never enter a key (a
result is the same wherever it is cached). Credentials are read from the environment or
`~/.netrc` only, never from the committed file, and are kept apart from the URL that
messages show.

    sandbox = true                                   # host stages in bubblewrap (default)

    [cache]
    remote = "https://cache.example.org/hefbuild"   # or file:///mnt/shared/hefbuild-cache,
                                                     # or grpcs://cache.example.org/instance
    upload = false                                   # developers read, CI writes
    timeout = "30s"                                  # idle timeout of every request
    min_rate = "1MiB"                                # slowest transfer kept, per second
    worker = "ci-runner-3"                           # the entries' worker name ("hefbuild")
    trusted_keys = ["ci-2026:BASE64PUBLICKEY"]       # accept only entries signed by these
    signing_key = "/path/to/ci.secret"               # sign uploads (usually from the env)
    compression = "zstd"                             # zstd on a gRPC cache's wire ("none")

    [executor]
    kind = "ray"                                     # stages on a Ray cluster (default: local)
    address = "head.example.org:6379"                # or "auto"; HEFBUILD_RAY_ADDRESS wins
    node_types = [{ CPU = 4, npu = 1 }]              # what an autoscaler may start

    [gc]                                             # the store's bounds: `doit gc` with no
    max_size = "50G"                                 # option, and every cluster node's own
    max_age = "30d"                                  # store after each stage it ran

Environment (CI runners): HEFBUILD_SANDBOX, HEFBUILD_REMOTE_CACHE, HEFBUILD_REMOTE_UPLOAD,
HEFBUILD_REMOTE_TIMEOUT, HEFBUILD_REMOTE_MIN_RATE, HEFBUILD_REMOTE_WORKER,
HEFBUILD_REMOTE_COMPRESSION,
HEFBUILD_TRUSTED_KEYS (comma-separated), HEFBUILD_SIGNING_KEY (a key file),
HEFBUILD_REMOTE_TOKEN (bearer), HEFBUILD_REMOTE_USER + HEFBUILD_REMOTE_PASSWORD
(basic), HEFBUILD_REMOTE_CA_BUNDLE (PEM file), HEFBUILD_RAY_ADDRESS (stages on that Ray
cluster), HEFBUILD_EXECUTOR (`local` runs everything here whatever the file says),
HEFBUILD_GC_MAX_SIZE and HEFBUILD_GC_MAX_AGE (the [gc] bounds).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from .executor_settings import SETTINGS_FILE, ExecutorSettings, executor_settings
from .params import parse_duration, parse_size

__all__ = ["SETTINGS_FILE", "ExecutorSettings"]  # re-exported: settings are read from here

DEFAULT_TIMEOUT_S = 30.0
# A transfer slower than this on average is a stalled cache: 1 MiB/s still moves 4 GB
# within the hour, and a server trickling a byte every few seconds is cut off.
DEFAULT_MIN_RATE = 1 << 20
DEFAULT_WORKER = "hefbuild"  # not the hostname: CI machines' names would leak into the cache
_KEY_RE = re.compile(r"^[A-Za-z0-9._-]+:[A-Za-z0-9+/]{43}=$")  # name:base64(32 bytes)
_CACHE_KEYS = {"remote", "upload", "timeout", "min_rate", "worker", "trusted_keys",
               "signing_key", "ca_bundle", "transfers", "download", "compression"}
DEFAULT_TRANSFERS = 4  # blobs in flight at once, each way
MAX_TRANSFERS = 64
# "minimal": a remote hit records its outputs' digests and fetches their bytes only when
# something reads them; "all": every hit downloads every output into the store and build/.
DOWNLOAD_MODES = ("minimal", "all")
# "zstd": blobs cross a gRPC cache's wire zstd-compressed, where the server lists ZSTD in its
# capabilities (REAPI compressed-blobs; else plain). HTTP has no standard compressed CAS.
COMPRESSIONS = ("none", "zstd")
_SECRET_KEYS = {"token", "password", "user", "username", "auth"}
# Bazel's HTTP cache protocol, or the gRPC Remote APIs (REAPI v2; the path names the instance).
REMOTE_SCHEMES = ("http", "https", "grpc", "grpcs")
_URL_KINDS = "an http(s)://, grpc(s):// or file:// URL"


@dataclass(frozen=True)
class Credentials:
    """How to authenticate to the cache; never printed, logged or stored."""

    token: str | None = None
    user: str | None = None
    password: str | None = None

    def __repr__(self) -> str:  # a stray debug print must not leak them
        return "Credentials(<hidden>)"

    @property
    def present(self) -> bool:
        return bool(self.token or self.user)


@dataclass(frozen=True)
class CacheSettings:
    remote: str | None = None  # base URL without credentials
    upload: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    min_rate: int = DEFAULT_MIN_RATE  # bytes per second (transport: a transfer's deadline)
    worker: str = DEFAULT_WORKER  # ExecutedActionMetadata.worker of the entries it writes
    trusted_keys: tuple[str, ...] = ()
    signing_key: Path | None = None
    ca_bundle: Path | None = None
    credentials: Credentials = field(default_factory=Credentials)
    transfers: int = DEFAULT_TRANSFERS
    download: str = "all"  # one of DOWNLOAD_MODES
    compression: str = "none"  # one of COMPRESSIONS

    @property
    def minimal(self) -> bool:
        return self.download == "minimal"

    @property
    def shown(self) -> str:
        """The cache as messages name it: scheme, host and path, nothing secret."""
        return self.remote or "(none)"


@dataclass(frozen=True)
class GcSettings:
    """The store's bounds (None: unbounded); a cluster node applies them to its own store."""

    max_bytes: int | None = None
    max_age_s: float | None = None

    @property
    def bounded(self) -> bool:
        return self.max_bytes is not None or self.max_age_s is not None


@dataclass(frozen=True)
class Settings:
    cache: CacheSettings = field(default_factory=CacheSettings)
    sandbox: bool = True  # host stages in bubblewrap; false only by the project's choice
    executor: ExecutorSettings = field(default_factory=ExecutorSettings)
    gc: GcSettings = field(default_factory=GcSettings)


def load_settings(root: Path, env: dict[str, str] | None = None) -> Settings:
    env = dict(os.environ) if env is None else env
    path = root / SETTINGS_FILE
    doc = _read(path) if path.is_file() else {}
    unknown = set(doc) - {"cache", "sandbox", "executor", "gc"}
    if unknown:
        raise SpecError(SETTINGS_FILE, sorted(unknown)[0],
                        "unknown key (expected: [cache], [executor], [gc], sandbox)")
    table = doc.get("cache", {})
    if not isinstance(table, dict):
        raise SpecError(SETTINGS_FILE, "cache", f"a table, got {type(table).__name__}")
    return Settings(_cache(table, env, root), _sandbox(env.get("HEFBUILD_SANDBOX",
                                                              doc.get("sandbox", True))),
                    executor_settings(doc.get("executor", {}), env), _gc(doc.get("gc", {}), env))


def _gc(table: Any, env: dict[str, str]) -> GcSettings:
    """[gc] max_size / max_age (HEFBUILD_GC_MAX_SIZE / _MAX_AGE win), as `doit gc` reads them."""
    if not isinstance(table, dict):
        raise SpecError(SETTINGS_FILE, "gc", f"a table, got {type(table).__name__}")
    unknown = set(table) - {"max_size", "max_age"}
    if unknown:
        raise SpecError(SETTINGS_FILE, f"gc.{sorted(unknown)[0]}",
                        "unknown key (expected: max_size, max_age)")
    size = env.get("HEFBUILD_GC_MAX_SIZE") or table.get("max_size")
    age = env.get("HEFBUILD_GC_MAX_AGE") or table.get("max_age")
    if size in (None, "") and age in (None, ""):
        return GcSettings()
    from .bounds import parse_age, parse_size  # only when bounds are set

    try:
        return GcSettings(parse_size(str(size)) if size not in (None, "") else None,
                          parse_age(str(age)) if age not in (None, "") else None)
    except SpecError as exc:
        raise SpecError(SETTINGS_FILE, "gc.max_size / gc.max_age (or HEFBUILD_GC_MAX_*)",
                        exc.expected) from None


def _sandbox(value: Any) -> bool:
    try:
        return _upload(value)
    except SpecError:
        raise SpecError(SETTINGS_FILE, "sandbox (or HEFBUILD_SANDBOX)",
                        f"true or false, got {value!r}") from None


def _read(path: Path) -> dict[str, Any]:
    from .declfile import read_toml

    return read_toml(path, SETTINGS_FILE)


def _cache(table: dict[str, Any], env: dict[str, str], root: Path) -> CacheSettings:
    for key in table:
        if key in _SECRET_KEYS:
            raise SpecError(SETTINGS_FILE, f"cache.{key}", "no credentials in a committed file: "
                            "set HEFBUILD_REMOTE_TOKEN (or _USER/_PASSWORD) or use ~/.netrc")
        if key not in _CACHE_KEYS:
            raise SpecError(SETTINGS_FILE, f"cache.{key}", "unknown key (expected one of: "
                            + ", ".join(sorted(_CACHE_KEYS)) + ")")
    if isinstance(table.get("remote"), str) and "@" in table["remote"]:
        _remote(table["remote"], {})  # refused even when the environment overrides it
    remote, url_creds = _remote(env.get("HEFBUILD_REMOTE_CACHE", table.get("remote")), env)
    return CacheSettings(
        remote=remote,
        upload=_upload(env.get("HEFBUILD_REMOTE_UPLOAD", table.get("upload", False))),
        timeout_s=_timeout(env.get("HEFBUILD_REMOTE_TIMEOUT", table.get("timeout"))),
        min_rate=_min_rate(env.get("HEFBUILD_REMOTE_MIN_RATE", table.get("min_rate"))),
        worker=_worker(env.get("HEFBUILD_REMOTE_WORKER", table.get("worker"))),
        trusted_keys=_trusted(env.get("HEFBUILD_TRUSTED_KEYS", table.get("trusted_keys", []))),
        signing_key=_file(env.get("HEFBUILD_SIGNING_KEY", table.get("signing_key")),
                          "signing_key", root),
        ca_bundle=_file(env.get("HEFBUILD_REMOTE_CA_BUNDLE", table.get("ca_bundle")),
                        "ca_bundle", root),
        credentials=_credentials(remote, url_creds, env),
        transfers=_transfers(env.get("HEFBUILD_REMOTE_TRANSFERS", table.get("transfers"))),
        download=_download(env.get("HEFBUILD_REMOTE_DOWNLOAD", table.get("download"))),
        compression=_compression(env.get("HEFBUILD_REMOTE_COMPRESSION",
                                         table.get("compression"))),
    )


def _remote(value: Any, env: dict[str, str]) -> tuple[str | None, Credentials]:
    """The base URL with any `user:password@` moved out of it; '' switches the remote off."""
    if value is None or value == "":
        return None, Credentials()
    from urllib.parse import unquote, urlsplit, urlunsplit  # only with a remote configured

    where = "HEFBUILD_REMOTE_CACHE" if "HEFBUILD_REMOTE_CACHE" in env else "cache.remote"
    if not isinstance(value, str):
        raise SpecError(SETTINGS_FILE, where, _URL_KINDS)
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        raise SpecError(SETTINGS_FILE, where, f"a URL with a port 1-65535, got "
                        f"{parts.netloc.rpartition('@')[2]!r}") from None
    if parts.scheme == "file":
        if not parts.path.startswith("/") or parts.netloc not in ("", "localhost"):
            raise SpecError(SETTINGS_FILE, where, "a file:///absolute/path URL")
        return f"file://{parts.path.rstrip('/') or '/'}", Credentials()
    if parts.scheme not in REMOTE_SCHEMES:
        raise SpecError(SETTINGS_FILE, where, f"{_URL_KINDS}, got scheme "
                        f"{parts.scheme or '(none)'!r}")
    if not parts.hostname:
        raise SpecError(SETTINGS_FILE, where, f"a {parts.scheme}://host[:port]/... URL, got no "
                        f"host")
    if parts.username and where == "cache.remote":
        raise SpecError(SETTINGS_FILE, where, "a URL without user:password@ (a committed file "
                        "holds no credentials: set HEFBUILD_REMOTE_CACHE, "
                        "HEFBUILD_REMOTE_USER/_PASSWORD or use ~/.netrc)")
    password = None if parts.password is None else unquote(parts.password)
    creds = Credentials(user=unquote(parts.username), password=password) if parts.username \
        else Credentials()
    name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    host = name + (f":{port}" if port else "")
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", "")), creds


def _upload(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise SpecError(SETTINGS_FILE, "cache.upload (or HEFBUILD_REMOTE_UPLOAD)",
                    f"true or false, got {value!r}")


def _timeout(value: Any) -> float:
    if value is None:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = parse_duration(value)
    except (TypeError, ValueError):
        seconds = None
    if seconds is None or not 0 < seconds <= 3600:
        raise SpecError(SETTINGS_FILE, "cache.timeout (or HEFBUILD_REMOTE_TIMEOUT)",
                        f"a duration between 0 and 1h like \"30s\", got {value!r}")
    return float(seconds)


def _min_rate(value: Any) -> int:
    if value is None:
        return DEFAULT_MIN_RATE
    try:
        rate = parse_size(value)
    except (TypeError, ValueError):
        rate = 0
    if not rate >= 1024:
        raise SpecError(SETTINGS_FILE, "cache.min_rate (or HEFBUILD_REMOTE_MIN_RATE)",
                        f"bytes per second, at least 1KiB, like \"1MiB\", got {value!r}")
    return rate


def _transfers(value: Any) -> int:
    if value is None:
        return DEFAULT_TRANSFERS
    try:
        n = int(value) if not isinstance(value, (bool, float)) else 0
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_TRANSFERS:
        raise SpecError(SETTINGS_FILE, "cache.transfers (or HEFBUILD_REMOTE_TRANSFERS)",
                        f"blobs in flight at once, 1 to {MAX_TRANSFERS}, got {value!r}")
    return n


def _download(value: Any) -> str:
    if value is None or value == "":
        return "all"
    if value not in DOWNLOAD_MODES:
        raise SpecError(SETTINGS_FILE, "cache.download (or HEFBUILD_REMOTE_DOWNLOAD)",
                        f'"minimal" or "all", got {value!r}')
    return str(value)


def _compression(value: Any) -> str:
    if value is None or value == "":
        return "none"
    if value not in COMPRESSIONS:
        raise SpecError(SETTINGS_FILE, "cache.compression (or HEFBUILD_REMOTE_COMPRESSION)",
                        f'"zstd" or "none", got {value!r}')
    return str(value)


def _worker(value: Any) -> str:
    if value is None:
        return DEFAULT_WORKER
    if not isinstance(value, str) or not re.fullmatch(r"[\x21-\x7e]{1,128}", value):
        raise SpecError(SETTINGS_FILE, "cache.worker (or HEFBUILD_REMOTE_WORKER)",
                        f"a name of 1-128 printable ASCII characters without spaces, got "
                        f"{value!r}")
    return value


def _trusted(value: Any) -> tuple[str, ...]:
    keys = [k.strip() for k in value.split(",") if k.strip()] if isinstance(value, str) \
        else value
    if not isinstance(keys, list) or not all(isinstance(k, str) and _KEY_RE.match(k)
                                             for k in keys):
        raise SpecError(SETTINGS_FILE, "cache.trusted_keys (or HEFBUILD_TRUSTED_KEYS)",
                        "a list of public keys 'name:BASE64' (see `doit cache-key`)")
    return tuple(keys)


def _file(value: Any, key: str, root: Path) -> Path | None:
    if value is None or value == "":
        return None
    path = (root / Path(str(value)).expanduser()) if isinstance(value, str) else None
    if path is None or not path.is_file():
        raise SpecError(SETTINGS_FILE, f"cache.{key}", f"an existing file, got {value!r}")
    return path


def _credentials(remote: str | None, from_url: Credentials,
                 env: dict[str, str]) -> Credentials:
    if remote is None or remote.startswith("file://"):
        return Credentials()
    if env.get("HEFBUILD_REMOTE_TOKEN"):
        return Credentials(token=env["HEFBUILD_REMOTE_TOKEN"])
    if env.get("HEFBUILD_REMOTE_USER"):
        return Credentials(user=env["HEFBUILD_REMOTE_USER"],
                           password=env.get("HEFBUILD_REMOTE_PASSWORD", ""))
    if from_url.present:
        return from_url
    from urllib.parse import urlsplit

    return _from_netrc(urlsplit(remote).hostname or "", env)


def _from_netrc(host: str, env: dict[str, str]) -> Credentials:
    import netrc

    path = Path(env.get("NETRC") or Path(env.get("HOME", str(Path.home()))) / ".netrc")
    try:
        found = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return Credentials()
    if not found:
        return Credentials()
    login, _account, password = found
    return Credentials(user=login or "", password=password or "")


def worker_cache(remote: str, timeout_s: float, env: dict[str, str] | None = None,
                 min_rate: int = DEFAULT_MIN_RATE) -> CacheSettings:
    """The cache as a cluster node reaches it: the driver sends the URL only; credentials
    are the node's own (its environment or ~/.netrc), never carried with a task."""
    env = dict(os.environ) if env is None else env
    return CacheSettings(remote, timeout_s=timeout_s, min_rate=min_rate,
                         credentials=_credentials(remote, Credentials(), env))
