"""A stand-in for the Hugging Face hub's HTTP interface, on loopback, for lock and fetch tests.

It serves the two endpoints huggingface_hub uses here: the model-info API
(`/api/models/<repo>/revision/<rev>`) and file resolution
(`/<repo>/resolve/<rev>/<file>`, HEAD and GET). One repository, one branch `main`
pointing at one commit. Real huggingface_hub client code talks to it over real HTTP.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


@dataclass
class FakeRepo:
    repo_id: str
    commit: str
    files: dict[str, bytes]
    lfs: set[str] = field(default_factory=set)  # files whose sha256 the API reports
    requests: list[str] = field(default_factory=list)

    def resolves(self, rev: str) -> bool:
        return rev in ("main", self.commit)


class _Handler(BaseHTTPRequestHandler):
    repo: FakeRepo

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass

    def do_HEAD(self) -> None:  # noqa: N802 - http.server naming
        self._serve(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        path = unquote(urlparse(self.path).path)
        self.repo.requests.append(f"{self.command} {path}")
        api = f"/api/models/{self.repo.repo_id}/revision/"
        resolve = f"/{self.repo.repo_id}/resolve/"
        if path.startswith(api):
            self._model_info(path[len(api):], body)
        elif path.startswith(resolve):
            rev, _, name = path[len(resolve):].partition("/")
            self._file(rev, name, body)
        else:
            self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"},
                       body)

    def _model_info(self, rev: str, body: bool) -> None:
        if not self.repo.resolves(rev):
            self._send(404, b"{}", {"X-Error-Code": "RevisionNotFound"}, body)
            return
        siblings = []
        for name, data in sorted(self.repo.files.items()):
            entry: dict = {"rfilename": name, "size": len(data)}
            if name in self.repo.lfs:
                entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                                "pointerSize": 134}
            siblings.append(entry)
        info = {"id": self.repo.repo_id, "modelId": self.repo.repo_id, "sha": self.repo.commit,
                "siblings": siblings, "private": False}
        self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)

    def _file(self, rev: str, name: str, body: bool) -> None:
        data = self.repo.files.get(name)
        if not self.repo.resolves(rev) or data is None:
            self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, body)
            return
        headers = {"X-Repo-Commit": self.repo.commit,
                   "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                   "Content-Type": "application/octet-stream"}
        self._send(200, data, headers, body)

    def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


class FakeHub:
    """`with FakeHub(repo) as hub:` serves until the block ends; `hub.endpoint` is its URL."""

    def __init__(self, repo: FakeRepo) -> None:
        handler = type("Handler", (_Handler,), {"repo": repo})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.repo = repo

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
