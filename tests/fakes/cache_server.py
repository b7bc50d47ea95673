"""A real nginx WebDAV server on 127.0.0.1 standing in for a Bazel-style HTTP remote cache.

`NginxCache` runs a private nginx (its own prefix, config, logs and temp folders in one
scratch folder; Debian's /etc/nginx is not read) whose `location /` stores `PUT /cas/<sha256>`
and `PUT /ac/<key>` as files under `data` and serves them back with GET/HEAD (404 when
absent). nginx checks nothing about the bytes: a PUT whose body does not match its digest is
stored as sent. Options make it demand a bearer token or basic auth, or behave as a broken
server (one status for everything, or for PUT only).

`SilentServer` accepts TCP connections on 127.0.0.1, reads whatever the client sends and never
answers, until stopped: a cache that hangs.

Both stop only the processes and sockets they started (nginx by its master's PID, then any of
that master's workers left behind).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from types import TracebackType

NGINX = "/usr/sbin/nginx"
DAV_EXT_MODULES = (
    "/usr/lib/nginx/modules/ngx_http_dav_ext_module.so",
    "/usr/share/nginx/modules/ngx_http_dav_ext_module.so",
)
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
AUTH_SCOPES = ("write", "all")

# RFC 6750 b64token: the only characters a bearer token may have, and none nginx interprets.
_BEARER_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
# nginx's predefined "combined" format:
# $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer"
# "$http_user_agent". nginx writes a '"' inside a field as \x22, so a field has none.
_COMBINED = re.compile(r'^\S+ - .*? \[[^\]]*\] "(?P<request>[^"]*)" (?P<status>\d{3}) '
                       r'(?P<sent>\d+)')


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def dav_ext_module() -> Path | None:
    """The ngx_http_dav_ext_module shared object (libnginx-mod-http-dav-ext), if installed."""
    for candidate in DAV_EXT_MODULES:
        if Path(candidate).is_file():
            return Path(candidate)
    return None


def _quote(value: str | os.PathLike[str]) -> str:
    """A path as an nginx config string; refuses what nginx would interpret inside one."""
    text = str(value)
    if any(ch in text for ch in '"\\$\n\r'):
        raise ValueError(f"unusable in an nginx config: {text!r}")
    return f'"{text}"'


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no {path.name})"
    return "\n".join(text.splitlines()[-lines:]) or f"({path.name} is empty)"


def _children(pid: int) -> list[int]:
    """PIDs whose parent is `pid` (nginx's workers of that master)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after it.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry.name))
    return found


def _is_nginx(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "nginx"
    except OSError:
        return False


def _shutdown(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the master (nginx's fast shutdown: it stops its workers, then exits), wait;
    after STOP_TIMEOUT_S SIGKILL it and the workers it had (they do not die with it)."""
    if proc.poll() is not None:
        return
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
        return  # a master that exits by itself has waited for its workers
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pid in workers:
        if _is_nginx(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class NginxCache:
    """A private nginx on 127.0.0.1 serving `data` as an HTTP remote cache (WebDAV PUT/DELETE).

    auth: a bearer token; requests must carry `Authorization: Bearer <auth>` or get 401 -
        PUT/DELETE (and any other non-GET/HEAD method) only with auth_scope "write", every
        method with "all".
    basic: (user, password) for HTTP basic auth on every method (401 with WWW-Authenticate).
    status: every request answers this status (a broken server); checked before any auth.
    put_status: PUT answers this status (e.g. 507 full, 413 too large); GET/HEAD still work.
        Checked after the bearer token but before basic auth (nginx's phase order).
    root: the scratch folder (conf, logs, temp, data); default a new temporary folder that is
        removed when this object is garbage-collected (or at interpreter exit).
    sendfile: files go out with sendfile(2), as distributions' nginx.conf sets it (nginx's
        own default is off: a read and a write per buffer).

    start() may be called again after stop(): the server comes back on the same port and data.
    """

    def __init__(
        self,
        *,
        auth: str | None = None,
        auth_scope: str = "write",
        basic: tuple[str, str] | None = None,
        status: int | None = None,
        put_status: int | None = None,
        root: str | os.PathLike[str] | None = None,
        sendfile: bool = False,
    ) -> None:
        if auth_scope not in AUTH_SCOPES:
            raise ValueError(f"auth_scope must be one of {AUTH_SCOPES}, not {auth_scope!r}")
        if auth is not None and not _BEARER_TOKEN.fullmatch(auth):
            raise ValueError(f"not a bearer token (RFC 6750 characters only): {auth!r}")
        if auth is not None and basic is not None:
            raise ValueError("auth and basic both use the Authorization header: pick one")
        if basic is not None:
            user, password = basic
            if not user or any(ch in user for ch in ":\n\r") or any(
                ch in password for ch in "\n\r"
            ):
                raise ValueError(f"unusable basic-auth user or password: {basic!r}")
        for name, value in (("status", status), ("put_status", put_status)):
            if value is not None and not 100 <= value <= 599:
                raise ValueError(f"{name} must be an HTTP status 100..599, not {value!r}")
        self.auth = auth
        self.auth_scope = auth_scope
        self.basic = basic
        self.status = status
        self.put_status = put_status
        self.sendfile = sendfile
        if root is None:
            self.root = Path(tempfile.mkdtemp(prefix="hefbuild-nginx-"))
            weakref.finalize(self, shutil.rmtree, str(self.root), ignore_errors=True)
        else:
            self.root = Path(root).resolve()
        self.data = self.root / "data"
        self.access_log = self.root / "logs" / "access.log"
        self.error_log = self.root / "logs" / "error.log"
        self.conf_path = self.root / "nginx.conf"
        self._stderr_path = self.root / "logs" / "stderr.log"
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None

    # --- addresses and files ------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("NginxCache has not been started")
        return self._port

    @property
    def url(self) -> str:
        """The cache base: `<url>/cas/<sha256>` and `<url>/ac/<key>`."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The nginx master's PID."""
        if self._proc is None:
            raise RuntimeError("NginxCache is not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def blob_path(self, digest: str) -> Path:
        return self.data / "cas" / digest

    def ac_path(self, key: str) -> Path:
        return self.data / "ac" / key

    def seed_blob(self, content: bytes) -> str:
        """Stores `content` under cas/<its sha256> directly on disk; returns the digest."""
        digest = hashlib.sha256(content).hexdigest()
        path = self.blob_path(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        return digest

    def requests(self, wait_for: int = 0, timeout: float = 5.0) -> list[tuple[str, str, int]]:
        """(method, request target, status) of every logged request, oldest first.

        nginx logs a request just after sending its response, so a client can see the response
        before the line exists: `wait_for=n` polls until at least n lines are there (or
        `timeout` seconds pass, then returns what there is).
        """
        deadline = time.monotonic() + timeout
        while True:
            found = self._parse_access_log()
            if len(found) >= wait_for or time.monotonic() >= deadline:
                return found
            time.sleep(0.02)

    def sent_bytes(self, method: str = "GET", prefix: str = "/") -> int:
        """Body bytes the server sent for `method` requests under `prefix` (its access
        log's $body_bytes_sent): what clients downloaded."""
        total = 0
        for match in self._matches():
            parts = match["request"].split(" ")
            if parts[0] == method and len(parts) > 1 and parts[1].startswith(prefix):
                total += int(match["sent"])
        return total

    def _matches(self) -> list[re.Match[str]]:
        try:
            lines = self.access_log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []
        return [m for m in map(_COMBINED.match, lines) if m is not None]

    def _parse_access_log(self) -> list[tuple[str, str, int]]:
        try:
            lines = self.access_log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []
        found = []
        for line in lines:
            match = _COMBINED.match(line)
            if match is None:
                continue
            parts = match["request"].split(" ")
            method = parts[0]
            target = parts[1] if len(parts) > 1 else ""
            found.append((method, target, int(match["status"])))
        return found

    # --- configuration ------------------------------------------------------------------------
    def _config(self) -> str:
        temp = self.root / "temp"
        user = "user root;" if os.geteuid() == 0 else "# not root: workers run as this user"
        module = dav_ext_module()
        server_rules = []
        location_rules = []
        if self.status is not None:
            server_rules.append(f"return {self.status};")
        if self.auth is not None:
            bearer = _quote(f"Bearer {self.auth}")
            if self.auth_scope == "all":
                server_rules.append(f"if ($http_authorization != {bearer}) {{ return 401; }}")
            else:
                server_rules += [
                    'set $hefbuild_deny "";',
                    'if ($request_method !~ "^(GET|HEAD)$") { set $hefbuild_deny "w"; }',
                    f"if ($http_authorization != {bearer}) "
                    '{ set $hefbuild_deny "${hefbuild_deny}x"; }',
                    'if ($hefbuild_deny = "wx") { return 401; }',
                ]
        if self.put_status is not None:
            location_rules.append(f"if ($request_method = PUT) {{ return {self.put_status}; }}")
        if self.basic is not None:
            location_rules += [
                'auth_basic "hefbuild-cache";',
                f"auth_basic_user_file {_quote(self.root / 'htpasswd')};",
            ]
        if module is not None:
            location_rules.append("dav_ext_methods PROPFIND OPTIONS;")
        return "\n".join([
            "# Written by tests/fakes/cache_server.py; run with -g 'daemon off;'.",
            user,
            "worker_processes 1;",
            f"pid {_quote(self.root / 'nginx.pid')};",
            f"lock_file {_quote(self.root / 'nginx.lock')};",
            f"error_log {_quote(self.error_log)} notice;",
            f"load_module {_quote(module)};" if module is not None else "# no dav_ext module",
            "",
            "events { worker_connections 512; }",
            "",
            "http {",
            "    default_type application/octet-stream;",
            # Unbuffered: each line is written when its request is done.
            f"    access_log {_quote(self.access_log)} combined;",
            f"    client_body_temp_path {_quote(temp / 'body')};",
            f"    proxy_temp_path {_quote(temp / 'proxy')};",
            f"    fastcgi_temp_path {_quote(temp / 'fastcgi')};",
            f"    uwsgi_temp_path {_quote(temp / 'uwsgi')};",
            f"    scgi_temp_path {_quote(temp / 'scgi')};",
            "    client_max_body_size 0;",
            "    server_tokens off;",
            f"    sendfile {'on' if self.sendfile else 'off'};",
            "    server {",
            f"        listen 127.0.0.1:{self._port};",
            "        server_name _;",
            f"        root {_quote(self.data)};",
            *("        " + rule for rule in server_rules),
            "        location / {",
            "            dav_methods PUT DELETE;",
            "            create_full_put_path on;",
            "            dav_access user:rw group:r all:r;",
            *("            " + rule for rule in location_rules),
            "        }",
            "    }",
            "}",
            "",
        ])

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> NginxCache:
        if self.running:
            return self
        if not Path(NGINX).is_file():
            raise RuntimeError(f"{NGINX} is missing: run .ci/nginx-up")
        for folder in (self.data / "cas", self.data / "ac", self.root / "logs",
                       self.root / "temp"):
            folder.mkdir(parents=True, exist_ok=True)
        if self.basic is not None:
            user, password = self.basic
            (self.root / "htpasswd").write_text(f"{user}:{{PLAIN}}{password}\n")
        # A port picked here can be taken before nginx binds it: retry with another, but a
        # restart keeps its port (clients hold the url).
        attempts = 3 if self._port is None else 1
        for attempt in range(attempts):
            if self._port is None or attempt:
                self._port = free_port()
            self.conf_path.write_text(self._config())
            try:
                self._launch()
                return self
            except _PortTaken:
                continue
        raise RuntimeError(f"nginx found no free port in {attempts} attempts:\n"
                           f"{_tail(self.error_log)}")

    def _launch(self) -> None:
        log_start = self.error_log.stat().st_size if self.error_log.exists() else 0
        with open(self._stderr_path, "ab") as stderr:
            proc = subprocess.Popen(
                [NGINX, "-p", str(self.root), "-c", str(self.conf_path),
                 "-e", str(self.error_log), "-g", "daemon off;"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            )
        self._proc = proc
        self._finalizer = weakref.finalize(self, _shutdown, proc)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                self._forget()
                errors = self._error_log_since(log_start)
                if "Address already in use" in errors:
                    raise _PortTaken(errors)
                raise RuntimeError(
                    f"nginx exited with {proc.returncode} before accepting on {self.url}:\n"
                    f"{errors or _tail(self.error_log)}\nstderr:\n{_tail(self._stderr_path)}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() >= deadline:
                    self.stop()
                    raise RuntimeError(
                        f"nginx did not accept on {self.url} within {START_TIMEOUT_S} s:\n"
                        f"{_tail(self.error_log)}\nstderr:\n{_tail(self._stderr_path)}"
                    ) from None
                time.sleep(0.02)

    def _error_log_since(self, offset: int) -> str:
        try:
            with open(self.error_log, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace").strip()
        except OSError:
            return ""

    def _forget(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = None
        self._proc = None

    def stop(self) -> None:
        """Stops nginx by its master's PID and waits for it; a no-op when not running."""
        proc = self._proc
        if proc is None:
            return
        try:
            _shutdown(proc)
        finally:
            self._forget()

    def __enter__(self) -> NginxCache:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.url if self.running else "stopped"
        return f"NginxCache({where}, root={str(self.root)!r})"


class _PortTaken(RuntimeError):
    pass


class SilentServer:
    """Accepts TCP connections on 127.0.0.1 and never answers: reads and drops what clients
    send and holds every connection open until stop(). `accepted` counts connections,
    `bytes_received` what arrived on them."""

    def __init__(self) -> None:
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._connections: list[socket.socket] = []
        self._port: int | None = None
        self.accepted = 0
        self.bytes_received = 0

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("SilentServer has not been started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SilentServer:
        if self._thread is not None:
            return self
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self._port or 0))
            listener.listen(64)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._port = int(listener.getsockname()[1])
        self._stopping.clear()
        self._thread = threading.Thread(target=self._serve, name=f"silent-{self._port}",
                                        daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        assert self._listener is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in selector.select(timeout=0.05):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._listener:
                        try:
                            conn, _ = sock.accept()
                        except (BlockingIOError, InterruptedError):
                            continue
                        conn.setblocking(False)
                        self._connections.append(conn)
                        self.accepted += 1
                        selector.register(conn, selectors.EVENT_READ)
                        continue
                    try:
                        chunk = sock.recv(65536)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        chunk = b""
                    self.bytes_received += len(chunk)
                    if not chunk:  # the client hung up: stop watching, keep it until stop()
                        selector.unregister(sock)

    def stop(self) -> None:
        """Closes the listener and every accepted connection, and joins the thread."""
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        thread.join()
        self._thread = None
        for conn in self._connections:
            conn.close()
        self._connections.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def __enter__(self) -> SilentServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
