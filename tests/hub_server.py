"""A Hub on 127.0.0.1 for the tests: the routes of the Hugging Face Hub's HTTP API that `huggingface_hub` calls to
create a model repository, upload a folder in one commit, read a repository's metadata and download its files, with
answers shaped as its client code reads them (`huggingface_hub.hf_api`, `_commit_api`, `file_download`). Every
file is uploaded as a regular git blob (the preupload answer says so: no LFS, no Xet), kept in memory.

    with LoopbackHub() as hub:       # hub.endpoint: http://127.0.0.1:PORT, for HF_ENDPOINT
        ...                          # push and load with the real clients (HF_HUB_DISABLE_XET=1, HF_TOKEN=hf_test)
        hub.files("me/tiny")         # {path: bytes} at main
        hub.commits("me/tiny")       # the commit messages, oldest first

The tokens: `hf_test` writes as the user (`me`, or `LoopbackHub(user=...)`) and in the organization `team`;
`hf_read` is read-only; any other is refused. Revisions: `main` or any commit's sha (each commit keeps its files).
No PyPI package serves this API; this one answers only what the tests drive through the real clients.
"""

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

import yaml

USER = "me"
ORG = "team"
# `hf_canary_...`: a write token like `hf_test`, whose bytes a test looks for in every file written and pushed
TOKENS = {"hf_test": "write", "hf_read": "read", "hf_fine_read": "fineGrained", "hf_fine_write": "fineGrained",
          "hf_canary_5f3a9c1e7b": "write"}  # fmt: skip
# the fine-grained tokens' scopes, as the Hub's whoami gives them: each on the user's own namespace only
SCOPES = {"hf_fine_read": ["repo.content.read"], "hf_fine_write": ["repo.content.read", "repo.write"]}


@dataclass
class Repo:
    files: dict[str, bytes] = field(default_factory=dict)  # at main
    commits: list[tuple[str, str, dict]] = field(default_factory=list)  # (sha, message, files after it)
    private: bool | None = None  # as create_repo asked (None: not said: the account's default)

    @property
    def sha(self) -> str:
        return self.commits[-1][0] if self.commits else "0" * 40

    def at(self, rev: str | None) -> "Repo | None":
        """The repository as of `rev` (main or a commit's sha; None is main), or None for an unknown revision."""
        if rev in (None, "main", self.sha):
            return self
        for sha, message, files in self.commits:
            if sha == rev:
                return Repo(dict(files), [(sha, message, files)])
        return None


class LoopbackHub:
    """The server, started on a free port of 127.0.0.1 by `with` and stopped at its end."""

    def __init__(self, user: str = USER) -> None:
        self.user = user  # the name the tokens belong to
        self.repos: dict[str, Repo] = {}
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                hub.route(self, "GET")

            def do_HEAD(self) -> None:
                hub.route(self, "HEAD")

            def do_POST(self) -> None:
                hub.route(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "LoopbackHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def files(self, repo_id: str) -> dict[str, bytes]:
        return dict(self.repos[repo_id].files)

    def commits(self, repo_id: str) -> list[str]:
        return [message for _, message, _ in self.repos[repo_id].commits]

    # --- the API ---
    def route(self, request: BaseHTTPRequestHandler, method: str) -> None:
        path = unquote(urlparse(request.path).path)
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0)) if method == "POST" else b""
        routes = [
            ("POST", r"/api/repos/create", self.create),
            ("GET", r"/api/whoami-v2", self.whoami),
            ("POST", r"/api/validate-yaml", self.validate_yaml),
            ("POST", r"/api/models/(?P<repo>[^/]+/[^/]+)/preupload/(?P<rev>[^/]+)", self.preupload),
            ("POST", r"/api/models/(?P<repo>[^/]+/[^/]+)/commit/(?P<rev>[^/]+)", self.commit),
            ("GET", r"/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<sub>.*))?", self.tree),
            ("GET", r"/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?", self.info),
            ("GET", r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)", self.resolve),
            ("HEAD", r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)", self.resolve),
        ]
        for verb, pattern, handler in routes:
            match = re.fullmatch(pattern, path)
            if verb == method and match:
                token = request.headers.get("Authorization", "").removeprefix("Bearer ")
                extra = {"token": token} if handler == self.whoami else {}
                with self.lock:
                    status, headers, payload = handler(body=body, **match.groupdict(), **extra)
                break
        else:
            status, headers, payload = 404, {}, json.dumps({"error": f"no route {method} {path}"}).encode()
        request.send_response(status)
        headers = {"Content-Type": "application/json", **headers}
        if status >= 400:
            headers["X-Error-Message"] = json.loads(payload).get("error", "")
        for name, value in headers.items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        if method != "HEAD":
            request.wfile.write(payload)

    @staticmethod
    def answer(data, status: int = 200, headers: dict | None = None) -> tuple[int, dict, bytes]:
        return status, headers or {}, json.dumps(data).encode()

    def repo(self, repo: str, rev: str | None) -> Repo | None:
        found = self.repos.get(repo)
        return None if found is None else found.at(rev)

    def missing(self, repo: str):
        return self.answer({"error": f"Repository Not Found: {repo}"}, 404, {"X-Error-Code": "RepoNotFound"})

    def create(self, body: bytes) -> tuple:
        request = json.loads(body)
        repo_id = f"{request.get('organization') or self.user}/{request['name']}"
        if repo_id in self.repos:
            return self.answer({"error": "You already created this model repo", "url": f"{self.endpoint}/{repo_id}"},
                               409)  # fmt: skip
        visibility = request.get("visibility")  # huggingface_hub 1.x and later; `private` before
        private = {"private": True, "public": False}.get(visibility, request.get("private"))
        self.repos[repo_id] = Repo(private=private)
        return self.answer({"url": f"{self.endpoint}/{repo_id}", "name": repo_id, "id": repo_id})

    def whoami(self, body: bytes, token: str) -> tuple:
        """`hf_test`: a write token of the user (`me` by default), a member of the organization `team`; `hf_read`: a
        read-only one; `hf_fine_read`/`hf_fine_write`: fine-grained tokens that may read / write the user's own
        repositories (not the organization's); any other token is refused (401), as the Hub refuses an unknown
        token."""
        if token not in TOKENS:
            return self.answer({"error": "Invalid credentials in Authorization header"}, 401)
        name = self.user
        user = {"type": "user", "name": name, "fullname": name, "orgs": [{"name": ORG, "roleInOrg": "write"}]}
        access = {"displayName": "test", "role": TOKENS[token]}
        if token in SCOPES:
            entity = {"_id": "0" * 24, "type": "user", "name": name}
            access["fineGrained"] = {"global": [], "scoped": [{"entity": entity, "permissions": SCOPES[token]}]}
        return self.answer({**user, "auth": {"accessToken": access}})

    def validate_yaml(self, body: bytes) -> tuple:
        """A README's metadata block must parse as a YAML mapping (the Hub checks more: its schema)."""
        content = json.loads(body)["content"]
        match = re.match(r"---\n(.*?)\n---", content, re.S)
        try:
            ok = match is None or isinstance(yaml.safe_load(match.group(1)) or {}, dict)
        except yaml.YAMLError:
            ok = False
        errors = [] if ok else [{"message": "the metadata block is not a YAML mapping"}]
        return self.answer({"errors": errors, "warnings": []}, 200 if ok else 400)

    def preupload(self, body: bytes, repo: str, rev: str) -> tuple:
        if self.repo(repo, rev) is None:
            return self.missing(repo)
        files = [{"path": item["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                 for item in json.loads(body)["files"]]  # fmt: skip
        return self.answer({"files": files, "commitOid": self.repos[repo].sha})

    def commit(self, body: bytes, repo: str, rev: str) -> tuple:
        found = self.repo(repo, rev)
        if found is None:
            return self.missing(repo)
        message = ""
        for line in body.splitlines():
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                message = value["summary"]
            elif key == "file":
                found.files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                found.files.pop(value["path"], None)
            elif key == "deletedFolder":
                prefix = value["path"].rstrip("/") + "/"
                for path in [path for path in found.files if path.startswith(prefix)]:
                    del found.files[path]
            else:
                return self.answer({"error": f"this test Hub takes no {key!r} commit operation"}, 400)
        sha = hashlib.sha1(f"{found.sha}{message}{sorted(found.files)}".encode()).hexdigest()
        found.commits.append((sha, message, dict(found.files)))
        return self.answer({"commitUrl": f"{self.endpoint}/{repo}/commit/{sha}", "commitOid": sha,
                            "pullRequestUrl": None})  # fmt: skip

    def entry(self, path: str, content: bytes) -> dict:
        return {"type": "file", "path": path, "size": len(content), "oid": hashlib.sha1(content).hexdigest()}

    def tree(self, body: bytes, repo: str, rev: str, sub: str | None) -> tuple:
        found = self.repo(repo, rev)
        if found is None:
            return self.missing(repo)
        prefix = (sub.rstrip("/") + "/") if sub else ""
        return self.answer([self.entry(path, data) for path, data in sorted(found.files.items())
                            if path.startswith(prefix)])  # fmt: skip

    def info(self, body: bytes, repo: str, rev: str | None) -> tuple:
        found = self.repo(repo, rev)
        if found is None:
            return self.missing(repo)
        siblings = [{"rfilename": path} for path in sorted(found.files)]
        return self.answer({"id": repo, "modelId": repo, "sha": found.sha, "private": False, "siblings": siblings,
                            "tags": [], "downloads": 0, "likes": 0})  # fmt: skip

    def resolve(self, body: bytes, repo: str, rev: str, file: str) -> tuple:
        found = self.repo(repo, rev)
        if found is None:
            return self.missing(repo)
        if file not in found.files:
            return self.answer({"error": f"Entry Not Found: {file}"}, 404, {"X-Error-Code": "EntryNotFound",
                                                                           "X-Repo-Commit": found.sha})  # fmt: skip
        content = found.files[file]
        etag = f'"{hashlib.sha1(content).hexdigest()}"'
        return 200, {"Content-Type": "application/octet-stream", "X-Repo-Commit": found.sha, "ETag": etag}, content
