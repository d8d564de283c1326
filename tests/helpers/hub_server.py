"""A Hugging Face Hub look-alike on 127.0.0.1, so push/pull round trips run through the real client offline.

It implements the endpoints that `huggingface_hub` 2.x calls for `create_repo`, `create_commit` /
`upload_file` / `upload_folder` / `push_to_hub` and for `hf_hub_download` / `snapshot_download` /
`from_pretrained(repo_id)`, for model repos:

    POST /api/repos/create                               create a repo (409 + its url if it exists)
    POST /api/validate-yaml                              check a README.md metadata block
    POST /api/models/{ns}/{name}/preupload/{rev}         always `uploadMode: "regular"`: no LFS, no Xet
    POST /api/models/{ns}/{name}/commit/{rev}            NDJSON: header, base64 files, deletions
    GET  /api/models/{ns}/{name}[/revision/{rev}]        repo info: `sha` and `siblings`
    GET  /api/models/{ns}/{name}/tree/{rev}[/{path}]     file listing (one page, `?recursive=`)
    HEAD, GET /{ns}/{name}/resolve/{rev}/{path}          file with `X-Repo-Commit`, `ETag`, `Content-Length`

Errors carry the `X-Error-Code` header (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`) that
the client turns into its typed exceptions. Files are stored content-addressed (by git blob id,
which the client also uses as ETag and to skip unchanged files) under a temporary directory.

`HF_ENDPOINT` is read when `huggingface_hub` is imported, so clients run in a subprocess whose
environment comes from `HubServer.client_env`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
import yaml
from huggingface_hub import ModelCardData
from huggingface_hub.repocard import REGEX_YAML_BLOCK
from huggingface_hub.utils.sha import git_hash

_REPO = r"(?P<repo>[^/]+/[^/]+)"
_REV = r"(?P<rev>[^/]+)"


class HubError(Exception):
    """An error answered to the client: HTTP status, optional `X-Error-Code`, message."""

    def __init__(
        self,
        status: int,
        message: str,
        error_code: str | None = None,
        body: dict | None = None,
        commit: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.body = {"error": message, **(body or {})}
        self.headers = {"X-Error-Message": message}
        if error_code:
            self.headers["X-Error-Code"] = error_code
        if commit:  # lets the client cache "this file does not exist at this commit"
            self.headers["X-Repo-Commit"] = commit


@dataclass
class Repository:
    """Branches pointing at commits; a commit is a `{path: blob id}` snapshot of the whole repo."""

    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, dict[str, str]] = field(default_factory=dict)
    last_modified: str = ""


class LocalHub:
    """Repositories and content-addressed blobs; every method is safe to call from several threads."""

    def __init__(self, root: Path):
        self.blob_dir = root / "blobs"
        self.blob_dir.mkdir(parents=True, exist_ok=True)
        self.repos: dict[str, Repository] = {}
        self.lock = threading.Lock()

    def create_repo(self, repo_id: str) -> bool:
        """Create `repo_id` with an empty initial commit on `main`; False if it already exists."""
        with self.lock:
            if repo_id in self.repos:
                return False
            self.repos[repo_id] = Repository()
            self._add_commit(repo_id, "main", parent=None, files={}, summary="initial commit")
            return True

    def repository(self, repo_id: str) -> Repository:
        if repo_id not in self.repos:
            raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return self.repos[repo_id]

    def resolve(self, repo_id: str, revision: str) -> str:
        """The commit id a branch name or a full commit id points at."""
        repository = self.repository(repo_id)
        if revision in repository.branches:
            return repository.branches[revision]
        if revision in repository.commits:
            return revision
        raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def files(self, repo_id: str, revision: str) -> tuple[str, dict[str, str]]:
        commit = self.resolve(repo_id, revision)
        return commit, self.repos[repo_id].commits[commit]

    def blob_path(self, blob_id: str) -> Path:
        return self.blob_dir / blob_id

    def commit(self, repo_id: str, branch: str, operations: list[dict]) -> str:
        """Apply NDJSON commit operations on top of `branch` and move the branch to the new commit."""
        with self.lock:
            parent = self.resolve(repo_id, branch)
            if branch not in self.repos[repo_id].branches:
                raise HubError(400, f"Can only commit to a branch, got {branch!r}")
            header = operations[0]["value"] if operations and operations[0].get("key") == "header" else None
            if header is None:
                raise HubError(400, "The first NDJSON line of a commit must be its header")
            expected_parent = header.get("parentCommit")
            if expected_parent is not None and not parent.startswith(expected_parent):
                raise HubError(412, f"Parent commit {expected_parent} is not the head of {branch} ({parent})")
            files = dict(self.repos[repo_id].commits[parent])
            for operation in operations[1:]:
                self._apply(files, operation)
            return self._add_commit(repo_id, branch, parent=parent, files=files, summary=header.get("summary", ""))

    def _apply(self, files: dict[str, str], operation: dict) -> None:
        key, value = operation.get("key"), operation.get("value", {})
        if key == "file":
            if value.get("encoding") != "base64":
                raise HubError(400, f"Unsupported encoding {value.get('encoding')!r} for {value.get('path')}")
            content = base64.b64decode(value["content"])
            blob_id = git_hash(content)
            self.blob_path(blob_id).write_bytes(content)
            files[value["path"]] = blob_id
        elif key == "deletedFile":
            if files.pop(value["path"], None) is None:
                raise HubError(404, f"A file with this name doesn't exist: {value['path']}", "EntryNotFound")
        elif key == "deletedFolder":
            prefix = value["path"].rstrip("/") + "/"
            for path in [path for path in files if path.startswith(prefix)]:
                del files[path]
        else:
            # "lfsFile" included: preupload never answers "lfs", so a client sending one is a bug.
            raise HubError(400, f"Unsupported commit operation {key!r}")

    def _add_commit(self, repo_id: str, branch: str, parent: str | None, files: dict[str, str], summary: str) -> str:
        repository = self.repos[repo_id]
        payload = json.dumps([repo_id, parent, sorted(files.items()), summary, len(repository.commits)])
        commit = hashlib.sha1(payload.encode()).hexdigest()
        repository.commits[commit] = files
        repository.branches[branch] = commit
        repository.last_modified = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
        return commit


def _card_metadata_errors(content: str) -> list[str]:
    """What the Hub would reject in a README.md: a metadata block that is not a YAML mapping or a bad model-index."""
    match = REGEX_YAML_BLOCK.search(content)
    if match is None:
        return []
    try:
        metadata = yaml.safe_load(match.group(2))
    except yaml.YAMLError as error:
        return [f"Invalid YAML in metadata block: {error}"]
    if metadata is None:
        return []
    if not isinstance(metadata, dict):
        return ["The metadata block must be a YAML mapping"]
    try:
        ModelCardData(**metadata)
    except ValueError as error:
        return [str(error)]
    return []


class HubRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like the Hub: every answer carries a Content-Length
    server: HubHTTPServer

    def do_POST(self) -> None:
        self._dispatch(
            (r"/api/repos/create", self._create_repo),
            (r"/api/validate-yaml", self._validate_yaml),
            (rf"/api/models/{_REPO}/preupload/{_REV}", self._preupload),
            (rf"/api/models/{_REPO}/commit/{_REV}", self._commit),
        )

    def do_GET(self) -> None:
        self._dispatch(
            (rf"/api/models/{_REPO}(?:/revision/{_REV})?", self._repo_info),
            (rf"/api/models/{_REPO}/tree/{_REV}(?:/(?P<path>.+))?", self._tree),
            (rf"/{_REPO}/resolve/{_REV}/(?P<path>.+)", self._resolve),
        )

    def do_HEAD(self) -> None:
        self._dispatch((rf"/{_REPO}/resolve/{_REV}/(?P<path>.+)", self._resolve))

    # ------------------------------------------------------------------ plumbing

    def _dispatch(self, *routes) -> None:
        url = urlsplit(self.path)
        self.query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        try:
            for pattern, handler in routes:
                match = re.fullmatch(pattern, url.path)
                if match:
                    handler(**{key: unquote(value) for key, value in match.groupdict().items() if value is not None})
                    return
            self.server.unhandled.append(f"{self.command} {self.path}")
            raise HubError(404, f"{self.command} {url.path} is not implemented by the test Hub")
        except HubError as error:
            self._send_json(error.body, status=error.status, headers=error.headers)

    def _read_json_lines(self) -> list:
        if "Content-Length" not in self.headers:
            raise HubError(411, "Request bodies must have a Content-Length")
        body = self.rfile.read(int(self.headers["Content-Length"]))
        return [json.loads(line) for line in body.splitlines() if line.strip()]

    def _require_token(self) -> None:
        if not self.headers.get("Authorization", "").startswith("Bearer "):
            raise HubError(401, "Write operations need a token (set HF_TOKEN)")

    def _send_json(self, body, status: int = 200, headers: dict | None = None) -> None:
        self._send(json.dumps(body).encode(), status, {"Content-Type": "application/json", **(headers or {})})

    def _send(self, data: bytes, status: int, headers: dict) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:
        self.server.log.append(format % args)

    # ------------------------------------------------------------------ endpoints

    def _create_repo(self) -> None:
        self._require_token()
        (payload,) = self._read_json_lines()
        if payload.get("type", "model") != "model":
            raise HubError(400, f"The test Hub only hosts model repos, got type {payload.get('type')!r}")
        if not payload.get("organization"):
            raise HubError(400, "The test Hub needs repo ids of the form 'namespace/name'")
        repo_id = f"{payload['organization']}/{payload['name']}"
        url = f"{self.server.endpoint}/{repo_id}"
        if not self.server.hub.create_repo(repo_id):
            raise HubError(409, "You already created this model repo", body={"url": url})
        self._send_json({"url": url, "name": repo_id, "id": repo_id})

    def _validate_yaml(self) -> None:
        (payload,) = self._read_json_lines()
        errors = _card_metadata_errors(payload.get("content", ""))
        body = {"errors": [{"message": message} for message in errors], "warnings": []}
        self._send_json(body, status=400 if errors else 200)

    def _preupload(self, repo: str, rev: str) -> None:
        self._require_token()
        (payload,) = self._read_json_lines()
        _, files = self.server.hub.files(repo, rev)
        answers = [
            {"path": entry["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": files.get(entry["path"])}
            for entry in payload["files"]
        ]
        self._send_json({"files": answers})

    def _commit(self, repo: str, rev: str) -> None:
        self._require_token()
        if self.query.get("create_pr"):
            raise HubError(400, "The test Hub does not implement pull requests")
        commit = self.server.hub.commit(repo, rev, self._read_json_lines())
        self._send_json(
            {"commitUrl": f"{self.server.endpoint}/{repo}/commit/{commit}", "commitOid": commit, "pullRequestUrl": None}
        )

    def _repo_info(self, repo: str, rev: str = "main") -> None:
        commit, files = self.server.hub.files(repo, rev)
        self._send_json(
            {
                "id": repo,
                "modelId": repo,
                "author": repo.split("/")[0],
                "sha": commit,
                "private": False,
                "lastModified": self.server.hub.repos[repo].last_modified,
                "tags": [],
                "siblings": [{"rfilename": path} for path in sorted(files)],
            }
        )

    def _tree(self, repo: str, rev: str, path: str = "") -> None:
        _, files = self.server.hub.files(repo, rev)
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        recursive = self.query.get("recursive", "false").lower() == "true"
        entries: dict[str, dict] = {}

        def add_folder(folder: str) -> None:
            entries.setdefault(folder, {"type": "directory", "path": folder, "oid": git_hash(folder.encode())})

        for file_path, blob_id in sorted(files.items()):
            if not file_path.startswith(prefix):
                continue
            parts = file_path[len(prefix) :].split("/")
            folders = [prefix + "/".join(parts[:depth]) for depth in range(1, len(parts))]
            if recursive or not folders:
                for folder in folders:
                    add_folder(folder)
                size = self.server.hub.blob_path(blob_id).stat().st_size
                entries[file_path] = {"type": "file", "path": file_path, "oid": blob_id, "size": size}
            else:
                add_folder(folders[0])
        if prefix and not entries:
            raise HubError(404, f"{path} does not exist at {rev}", "EntryNotFound")
        self._send_json(list(entries.values()))

    def _resolve(self, repo: str, rev: str, path: str) -> None:
        commit, files = self.server.hub.files(repo, rev)
        if path not in files:
            raise HubError(404, f"{path} does not exist at {rev}", "EntryNotFound", commit=commit)
        blob_id = files[path]
        data = self.server.hub.blob_path(blob_id).read_bytes()
        headers = {"Content-Type": "application/octet-stream", "ETag": f'"{blob_id}"', "X-Repo-Commit": commit}
        self._send(data, 200, headers)


class HubHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: LocalHub):
        super().__init__(("127.0.0.1", 0), HubRequestHandler)
        self.hub = hub
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        self.log: list[str] = []
        self.unhandled: list[str] = []


@dataclass
class HubServer:
    """A running test Hub: its `endpoint`, its storage and the requests it could not answer."""

    endpoint: str
    hub: LocalHub
    http: HubHTTPServer

    @property
    def unhandled(self) -> list[str]:
        return self.http.unhandled

    def client_env(self, hf_home: Path) -> dict[str, str]:
        """Environment for a client subprocess: this endpoint, online, a dummy token, a private cache."""
        env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        env.update(
            HF_ENDPOINT=self.endpoint,
            HF_HOME=str(hf_home),
            HF_HUB_CACHE=str(hf_home / "hub"),
            HF_TOKEN="hf_dummy_test_token",
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            NO_PROXY="127.0.0.1",
        )
        return env


@contextmanager
def running_hub(root: Path) -> Iterator[HubServer]:
    """Serve a fresh `LocalHub` stored under `root` on an ephemeral loopback port; stopped on exit."""
    http = HubHTTPServer(LocalHub(root))
    thread = threading.Thread(target=http.serve_forever, name="test-hub", daemon=True)
    thread.start()
    try:
        yield HubServer(endpoint=http.endpoint, hub=http.hub, http=http)
    finally:
        http.shutdown()
        http.server_close()
        thread.join(timeout=10)


@pytest.fixture
def hub_server(tmp_path: Path) -> Iterator[HubServer]:
    with running_hub(tmp_path / "hub-server") as server:
        yield server
