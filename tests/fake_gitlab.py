"""A local stand-in for GitLab's REST API v4, as far as the merge-request note uses it.

Strict like tests/fake_github.py: requests are checked against GitLab's documentation (REST
API: authentication, pagination; Notes API: merge request notes) and anything off is recorded
in `violations` (tests assert it stays empty) and answered with an error.

- Authentication: `PRIVATE-TOKEN: <token>` (a personal, project or group access token);
  `JOB-TOKEN` is accepted as a job token but the notes endpoints refuse it (403), as the job
  token's allowed endpoints do not include notes. Anything else: 401
  `{"message": "401 Unauthorized"}`.
- `GET /api/v4/user`: the token's user `{"id", "username", ...}`.
- `GET /api/v4/projects/:id/merge_requests/:iid/notes`: offset pagination (`page`, `per_page`
  at most 100, default 20) with `Link` (rel="next"), `X-Next-Page`, `X-Page`, `X-Per-Page`,
  `X-Total`; notes `{"id", "body", "author": {"id", "username"}, "system", "noteable_iid"}`.
- `POST .../notes` with a JSON body `{"body"}` (required, at most 1,000,000 characters; the
  documented optional attributes are never sent, so any other key is a violation): 201.
- `PUT .../notes/:note_id` with `{"body"}`: 200, only the note's author may (403 otherwise).
- `DELETE .../notes/:note_id`: 204, the note's author only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from tests.local_server import LocalServer

NOTES = re.compile(r"^/api/v4/projects/([^/]+)/merge_requests/(\d+)/notes(?:/(\d+))?$")
MAX_BODY = 1_000_000


@dataclass
class User:
    id: int
    username: str


@dataclass
class FakeGitLab(LocalServer):
    """The server and its state; `merge_requests[(project id, iid)]` holds each MR's notes."""

    tokens: dict[str, User] = field(default_factory=dict)
    merge_requests: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    fail: int = 0  # answer every notes request with this status (0: none)
    _next_id: int = 100

    def __post_init__(self) -> None:
        super().__init__()

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/v4"

    def add_token(self, token: str, user_id: int, username: str) -> None:
        self.tokens[token] = User(user_id, username)

    def add_merge_request(self, project_id: str, iid: int) -> list[dict[str, Any]]:
        return self.merge_requests.setdefault((project_id, iid), [])

    def add_note(
        self, project_id: str, iid: int, body: str, user: User, system: bool = False
    ) -> dict[str, Any]:
        self._next_id += 1
        note = {"id": self._next_id, "body": body, "system": system, "noteable_iid": iid,
                "author": {"id": user.id, "username": user.username}}  # fmt: skip
        self.merge_requests[(project_id, iid)].append(note)
        return note

    def calls(self, method: str, pattern: str = ".*") -> list[str]:
        return [p for m, p, _ in self.requests if m == method and re.fullmatch(pattern, p)]

    # -- the protocol ---------------------------------------------------------------------
    def _send(self, h: BaseHTTPRequestHandler, status: int, body: Any = None,
              headers: dict[str, str] | None = None) -> None:  # fmt: skip
        data = b"" if body is None else json.dumps(body).encode()
        h.send_response(status)
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        if body is not None:
            h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _violation(self, h: BaseHTTPRequestHandler, text: str) -> None:
        self.violations.append(text)
        self._send(h, 400, {"message": f"400 Bad request - {text}"})

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        with self._lock:
            self.requests.append((h.command, url.path, dict(h.headers.items())))
            self._serve(h, url.path, parse_qs(url.query), raw)

    def _user(self, h: BaseHTTPRequestHandler) -> tuple[User | None, bool]:
        """(the user, is it a job token) of the request's token."""
        if "Authorization" in h.headers:
            self.violations.append("a Bearer/Basic Authorization header: GitLab's notes "
                                   "client sends PRIVATE-TOKEN")  # fmt: skip
        private, job = h.headers.get("PRIVATE-TOKEN"), h.headers.get("JOB-TOKEN")
        if private is not None and job is not None:
            self.violations.append("both PRIVATE-TOKEN and JOB-TOKEN")
        if job is not None:
            return (User(0, "job-token") if job == "job-token" else None), True
        return self.tokens.get(private or ""), False

    def _serve(self, h: BaseHTTPRequestHandler, path: str, query: dict[str, list[str]],
               raw: bytes) -> None:  # fmt: skip
        user, job = self._user(h)
        if user is None:
            self._send(h, 401, {"message": "401 Unauthorized"})
            return
        if path == "/api/v4/user" and h.command == "GET":
            if job:
                self._send(h, 403, {"message": "403 Forbidden"})
            else:
                self._send(h, 200, {"id": user.id, "username": user.username, "state": "active"})
            return
        match = NOTES.match(path)
        if not match:
            self._violation(h, f"{h.command} {path} is not an endpoint the note uses")
            return
        project, iid, note_id = match[1], int(match[2]), match[3]
        if job:  # the job token's allowed endpoints do not include notes
            self._send(h, 403, {"message": "403 Forbidden"})
            return
        if self.fail:
            self._send(h, self.fail, {"message": f"{self.fail} injected"})
            return
        notes = self.merge_requests.get((project, iid))
        if notes is None:
            self._send(h, 404, {"message": "404 Not found"})
            return
        if h.command == "GET" and note_id is None:
            self._list(h, path, query, notes)
        elif h.command == "POST" and note_id is None:
            body = self._body(h, raw)
            if body is not None:
                self._next_id += 1
                note = {"id": self._next_id, "body": body, "system": False, "noteable_iid": iid,
                        "author": {"id": user.id, "username": user.username}}  # fmt: skip
                notes.append(note)
                self._send(h, 201, note)
        elif h.command in ("PUT", "DELETE") and note_id is not None:
            note = next((n for n in notes if n["id"] == int(note_id)), None)
            if note is None:
                self._send(h, 404, {"message": "404 Note Not Found"})
            elif note["author"]["id"] != user.id or note["system"]:
                self._send(h, 403, {"message": "403 Forbidden"})
            elif h.command == "DELETE":
                notes.remove(note)
                self._send(h, 204)
            else:
                body = self._body(h, raw)
                if body is not None:
                    note["body"] = body
                    self._send(h, 200, note)
        else:
            self._violation(h, f"{h.command} on {path}")

    def _body(self, h: BaseHTTPRequestHandler, raw: bytes) -> str | None:
        if not h.headers.get("Content-Type", "").startswith("application/json"):
            self._violation(h, "a note's body must be sent as JSON (Content-Type)")
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            self._violation(h, "the request body is not JSON")
            return None
        if not isinstance(doc, dict) or set(doc) != {"body"} or not isinstance(doc["body"], str):
            # GitLab documents more (internal, created_at, ...); the note sends only its body.
            self._violation(h, f"the note sends exactly {{'body': str}}, got {doc!r:.80}")
            return None
        if not doc["body"] or len(doc["body"]) > MAX_BODY:
            self._send(
                h, 400, {"message": {"note": ["is too long (maximum is 1000000 characters)"]}}
            )
            return None
        return str(doc["body"])

    def _list(self, h: BaseHTTPRequestHandler, path: str, query: dict[str, list[str]],
              notes: list[dict[str, Any]]) -> None:  # fmt: skip
        try:
            page = int(query.get("page", ["1"])[0])
            per_page = int(query.get("per_page", ["20"])[0])
        except ValueError:
            self._violation(h, f"page / per_page are not integers: {query}")
            return
        if not 1 <= per_page <= 100 or page < 1:
            self._violation(h, f"per_page {per_page} (1-100) or page {page} out of range")
            return
        items = notes[(page - 1) * per_page : page * per_page]
        headers = {"X-Page": str(page), "X-Per-Page": str(per_page), "X-Total": str(len(notes))}
        if page * per_page < len(notes):
            headers["X-Next-Page"] = str(page + 1)
            link = f"{self.url}{path}?{urlencode({'page': page + 1, 'per_page': per_page})}"
            headers["Link"] = f'<{link}>; rel="next"'
        else:
            headers["X-Next-Page"] = ""
        self._send(h, 200, items, headers)
