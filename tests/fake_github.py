"""A local stand-in for GitHub's REST API (this machine has no route to the real one).

It is strict on purpose: every request is checked against GitHub's documented API — method,
path, query parameters, headers (Authorization, `Accept: application/vnd.github+json`,
`X-GitHub-Api-Version`, User-Agent) and JSON bodies — and answered in the documented response
shapes with documented status codes. Anything off is recorded in `violations` (tests assert it
stays empty) and answered the way GitHub would (400/401/404/422).

Routes: actions caches (list with pagination/sort/key prefix, delete by id, delete by key,
usage), issue comments (list with pagination, create, update, delete; comments by several
authors), `GET /user` (the token's user; 403 for an installation token such as
GITHUB_TOKEN) and `POST /graphql` for `viewer { login }` (the token's own login: the user, or
for an installation token (`ghs_`) its app's bot, `github-actions[bot]` unless `bot` names a
custom GitHub App's `<slug>[bot]`). Faults are injected with `fail(...)`; `read_only=True`
simulates a fork's read-only token.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.local_server import LocalServer

API_VERSION = "2022-11-28"
MAX_COMMENT = 65536
DOCS = "https://docs.github.com/rest"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Fault:
    """Answer the next `times` requests matching (method, path regex) with this response."""

    method: str
    path: re.Pattern[str]
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    status: int = 0


class FakeGitHub(LocalServer):
    """The server plus its state; use as a context manager (see the `fake_github` fixture)."""

    def __init__(
        self,
        repository: str = "octo-org/fxcache-demo",
        token: str = "ghs_faketoken123",
        user: str = "octocat",
        bot: str = "github-actions[bot]",
    ):
        self.repository = repository
        self.token = token
        self.user = user  # GET /user's login for a personal token
        self.bot = bot  # the login of an installation token's app
        self.read_only = False
        self.caches: list[dict[str, Any]] = []
        self.comments: dict[int, list[dict[str, Any]]] = {}
        self.requests: list[Recorded] = []
        self.violations: list[str] = []
        self.faults: list[Fault] = []
        self._next_id = 1000
        super().__init__()

    def env(self) -> dict[str, str]:
        """The Actions variables that point fxcache at this server."""
        return {
            "GITHUB_API_URL": self.url,
            "GITHUB_REPOSITORY": self.repository,
            "GITHUB_TOKEN": self.token,
        }

    # -- state helpers -----------------------------------------------------------------------
    def new_id(self) -> int:
        with self._lock:
            self._next_id += 1
            return self._next_id

    def add_cache(
        self,
        key: str,
        size: int = 1024,
        ref: str = "refs/heads/main",
        last_accessed_at: str | None = None,
        created_at: str | None = None,
    ) -> dict[str, Any]:
        entry = {
            "id": self.new_id(),
            "ref": ref,
            "key": key,
            "version": "a" * 64,
            "last_accessed_at": last_accessed_at or _now(),
            "created_at": created_at or _now(),
            "size_in_bytes": size,
        }
        self.caches.append(entry)
        return entry

    def add_pull(self, number: int) -> None:
        self.comments.setdefault(number, [])

    def add_comment(self, number: int, body: str, login: str = "someone") -> dict[str, Any]:
        comment = self._comment(number, body, login)
        self.comments.setdefault(number, []).append(comment)
        return comment

    def fail(
        self,
        method: str,
        path_regex: str,
        status: int,
        body: Any = None,
        headers: dict[str, str] | None = None,
        times: int = 1,
    ) -> None:
        self.faults.append(
            Fault(
                method,
                re.compile(path_regex),
                status,
                body if body is not None else {"message": "fault"},
                headers or {},
                times,
            )
        )

    @property
    def identity(self) -> str:
        """Who the token writes as: installation tokens (ghs_) as their app's bot."""
        return self.bot if self.token.startswith("ghs_") else self.user

    def calls(self, method: str, path_regex: str = ".*") -> list[Recorded]:
        return [r for r in self.requests if r.method == method and re.fullmatch(path_regex, r.path)]

    def _comment(self, number: int, body: str, login: str) -> dict[str, Any]:
        cid = self.new_id()
        base = f"https://github.com/{self.repository}"
        return {
            "id": cid,
            "node_id": f"IC_{cid}",
            "url": f"{self.url}/repos/{self.repository}/issues/comments/{cid}",
            "html_url": f"{base}/pull/{number}#issuecomment-{cid}",
            "issue_url": f"{self.url}/repos/{self.repository}/issues/{number}",
            "body": body,
            "user": {
                "login": login,
                "id": 41898282 if login.endswith("[bot]") else 583231,
                "type": "Bot" if login.endswith("[bot]") else "User",
            },
            "created_at": _now(),
            "updated_at": _now(),
            "author_association": "NONE",
        }

    # -- HTTP ----------------------------------------------------------------------------------
    def _send(
        self,
        h: BaseHTTPRequestHandler,
        rec: Recorded,
        status: int,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        rec.status = status
        data = b"" if body is None or status == 204 else json.dumps(body).encode()
        h.send_response(status)
        if data:
            h.send_header("Content-Type", "application/json; charset=utf-8")
        h.send_header("Content-Length", str(len(data)))
        h.send_header("X-GitHub-Api-Version-Selected", API_VERSION)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if data:
            h.wfile.write(data)

    def _violation(self, h: BaseHTTPRequestHandler, rec: Recorded, status: int, text: str) -> None:
        self.violations.append(f"{rec.method} {rec.path}: {text}")
        self._send(h, rec, status, {"message": text, "documentation_url": DOCS})

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        split = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        rec = Recorded(
            h.command,
            split.path,
            parse_qs(split.query, keep_blank_values=True),
            {k.lower(): v for k, v in h.headers.items()},
            None,
        )
        self.requests.append(rec)
        if raw:
            if not h.headers.get("Content-Type", "").startswith("application/json"):
                return self._violation(
                    h, rec, 400, "body sent without Content-Type: application/json"
                )
            try:
                rec.body = json.loads(raw)
            except ValueError:
                return self._violation(h, rec, 400, "Problems parsing JSON")
        auth = h.headers.get("Authorization", "")
        if auth not in (f"Bearer {self.token}", f"token {self.token}"):
            self.violations.append(f"{rec.method} {rec.path}: bad or missing Authorization")
            return self._send(
                h, rec, 401, {"message": "Bad credentials", "documentation_url": DOCS}
            )
        if h.headers.get("Accept") != "application/vnd.github+json":
            return self._violation(h, rec, 415, "Accept must be application/vnd.github+json")
        if h.headers.get("X-GitHub-Api-Version") != API_VERSION:
            return self._violation(h, rec, 400, f"X-GitHub-Api-Version must be {API_VERSION}")
        if not h.headers.get("User-Agent"):
            return self._violation(
                h, rec, 403, "Request forbidden: a User-Agent header is required"
            )
        for fault in self.faults:
            if fault.times > 0 and fault.method == rec.method and fault.path.fullmatch(rec.path):
                fault.times -= 1
                return self._send(h, rec, fault.status, fault.body, fault.headers)
        if rec.path == "/user":
            return self._get_user(h, rec)
        if rec.path == "/graphql":
            return self._graphql(h, rec)
        prefix = f"/repos/{self.repository}/"
        if not rec.path.startswith(prefix):
            return self._send(h, rec, 404, {"message": "Not Found", "documentation_url": DOCS})
        route = rec.path[len(prefix) :]
        for pattern, method, handler in self._routes():
            match = re.fullmatch(pattern, route)
            if match and method == rec.method:
                return handler(h, rec, *match.groups())
        return self._violation(h, rec, 404, f"no such endpoint: {rec.method} {rec.path}")

    def _routes(self) -> list[tuple[str, str, Any]]:
        return [
            (r"actions/caches", "GET", self._list_caches),
            (r"actions/caches", "DELETE", self._delete_caches_by_key),
            (r"actions/caches/(\d+)", "DELETE", self._delete_cache),
            (r"actions/cache/usage", "GET", self._cache_usage),
            (r"issues/(\d+)/comments", "GET", self._list_comments),
            (r"issues/(\d+)/comments", "POST", self._create_comment),
            (r"issues/comments/(\d+)", "PATCH", self._update_comment),
            (r"issues/comments/(\d+)", "DELETE", self._delete_comment),
        ]

    def _query(
        self, h: BaseHTTPRequestHandler, rec: Recorded, allowed: dict[str, Any]
    ) -> dict[str, str] | None:
        values: dict[str, str] = {}
        for name, vals in rec.query.items():
            if name not in allowed:
                self._violation(h, rec, 422, f"unexpected query parameter {name!r}")
                return None
            if len(vals) != 1:
                self._violation(h, rec, 422, f"query parameter {name!r} given {len(vals)} times")
                return None
            check = allowed[name]
            if check is not None and not check(vals[0]):
                self._violation(h, rec, 422, f"invalid value for {name!r}: {vals[0]!r}")
                return None
            values[name] = vals[0]
        return values

    def _page(
        self, h: BaseHTTPRequestHandler, rec: Recorded, items: list[Any], q: dict[str, str]
    ) -> tuple[list[Any], dict[str, str]]:
        per_page = int(q.get("per_page", 30))
        page = int(q.get("page", 1))
        start = (page - 1) * per_page
        chunk = items[start : start + per_page]
        links = []
        last = max(1, -(-len(items) // per_page))
        base = f"{self.url}{rec.path}"

        def link(p: int, rel: str) -> str:
            params = {k: v for k, v in q.items() if k != "page"} | {"page": str(p)}
            query = "&".join(f"{k}={v}" for k, v in params.items())
            return f'<{base}?{query}>; rel="{rel}"'

        if page < last:
            links += [link(page + 1, "next"), link(last, "last")]
        if page > 1:
            links += [link(1, "first"), link(page - 1, "prev")]
        return chunk, ({"Link": ", ".join(links)} if links else {})

    # -- users (docs: rest/users/users#get-the-authenticated-user) --------------------------------
    def _get_user(self, h: BaseHTTPRequestHandler, rec: Recorded) -> None:
        if rec.method != "GET":
            return self._violation(h, rec, 404, f"no such endpoint: {rec.method} /user")
        if rec.query or rec.body is not None:
            return self._violation(h, rec, 422, "GET /user takes no query and no body")
        if self.token.startswith("ghs_"):  # an installation token is not a user
            return self._send(
                h,
                rec,
                403,
                {"message": "Resource not accessible by integration", "documentation_url": DOCS},
            )
        self._send(
            h,
            rec,
            200,
            {
                "login": self.user,
                "id": 583231,
                "node_id": "MDQ6VXNlcjU4MzIzMQ==",
                "type": "User",
                "site_admin": False,
                "html_url": f"https://github.com/{self.user}",
            },
        )

    # -- GraphQL (docs: graphql/guides/forming-calls-with-graphql; only viewer { login }) --------
    def _graphql(self, h: BaseHTTPRequestHandler, rec: Recorded) -> None:
        if rec.method != "POST":
            return self._violation(h, rec, 404, "GraphQL queries are POST /graphql")
        body = rec.body
        if rec.query or not isinstance(body, dict) or not isinstance(body.get("query"), str):
            return self._violation(h, rec, 400, 'body must be JSON {"query": "..."}')
        if set(body) - {"query", "variables", "operationName"}:
            return self._violation(h, rec, 400, f"unexpected keys {sorted(body)}")
        query = " ".join(body["query"].split())
        if not re.fullmatch(r"(query( \w+)? )?\{ viewer \{ login \} \}", query):
            self.violations.append(f"POST /graphql: query this fake does not serve: {query}")
            errors = [{"message": f"fake serves only viewer {{ login }}, not {query}"}]
            return self._send(h, rec, 200, {"errors": errors})
        self._send(h, rec, 200, {"data": {"viewer": {"login": self.identity}}})

    # -- caches (docs: rest/actions/cache) ---------------------------------------------------------
    def _list_caches(self, h: BaseHTTPRequestHandler, rec: Recorded) -> None:
        positive = lambda v: v.isdigit() and int(v) >= 1  # noqa: E731
        q = self._query(
            h,
            rec,
            {
                "per_page": lambda v: positive(v) and int(v) <= 100,
                "page": positive,
                "ref": None,
                "key": None,
                "sort": lambda v: v in ("created_at", "last_accessed_at", "size_in_bytes"),
                "direction": lambda v: v in ("asc", "desc"),
            },
        )
        if q is None:
            return
        items = [
            c
            for c in self.caches
            if c["key"].startswith(q.get("key", "")) and c["ref"] == q.get("ref", c["ref"])
        ]
        items.sort(
            key=lambda c: c[q.get("sort", "last_accessed_at")],
            reverse=q.get("direction", "desc") == "desc",
        )
        chunk, headers = self._page(h, rec, items, q)
        self._send(h, rec, 200, {"total_count": len(items), "actions_caches": chunk}, headers)

    def _write_denied(self, h: BaseHTTPRequestHandler, rec: Recorded) -> bool:
        if self.read_only:
            self._send(
                h,
                rec,
                403,
                {"message": "Resource not accessible by integration", "documentation_url": DOCS},
            )
            return True
        return False

    def _delete_cache(self, h: BaseHTTPRequestHandler, rec: Recorded, cache_id: str) -> None:
        if rec.query:
            return self._violation(h, rec, 422, "DELETE by id takes no query parameters")
        if self._write_denied(h, rec):
            return
        for entry in self.caches:
            if entry["id"] == int(cache_id):
                self.caches.remove(entry)
                return self._send(h, rec, 204)
        self._send(h, rec, 404, {"message": "Not Found", "documentation_url": DOCS})

    def _delete_caches_by_key(self, h: BaseHTTPRequestHandler, rec: Recorded) -> None:
        q = self._query(h, rec, {"key": None, "ref": None})
        if q is None:
            return
        if "key" not in q:
            return self._violation(h, rec, 422, "key is a required query parameter")
        if self._write_denied(h, rec):
            return
        gone = [
            c for c in self.caches if c["key"] == q["key"] and c["ref"] == q.get("ref", c["ref"])
        ]
        if not gone:
            return self._send(h, rec, 404, {"message": "Not Found", "documentation_url": DOCS})
        for entry in gone:
            self.caches.remove(entry)
        self._send(h, rec, 200, {"total_count": len(gone), "actions_caches": gone})

    def _cache_usage(self, h: BaseHTTPRequestHandler, rec: Recorded) -> None:
        if self._query(h, rec, {}) is None:
            return
        self._send(
            h,
            rec,
            200,
            {
                "full_name": self.repository,
                "active_caches_size_in_bytes": sum(c["size_in_bytes"] for c in self.caches),
                "active_caches_count": len(self.caches),
            },
        )

    # -- issue comments (docs: rest/issues/comments) ---------------------------------------------
    def _list_comments(self, h: BaseHTTPRequestHandler, rec: Recorded, number: str) -> None:
        positive = lambda v: v.isdigit() and int(v) >= 1  # noqa: E731
        q = self._query(
            h,
            rec,
            {
                "per_page": lambda v: positive(v) and int(v) <= 100,
                "page": positive,
                "since": None,
            },
        )
        if q is None:
            return
        if int(number) not in self.comments:
            return self._send(h, rec, 404, {"message": "Not Found", "documentation_url": DOCS})
        chunk, headers = self._page(h, rec, self.comments[int(number)], q)
        self._send(h, rec, 200, chunk, headers)

    def _check_body(self, h: BaseHTTPRequestHandler, rec: Recorded) -> str | None:
        body = rec.body
        if not isinstance(body, dict) or set(body) != {"body"} or not isinstance(body["body"], str):
            self._violation(h, rec, 422, 'JSON body must be exactly {"body": "<markdown>"}')
            return None
        if len(body["body"]) > MAX_COMMENT:
            self._send(
                h,
                rec,
                422,
                {
                    "message": "Validation Failed",
                    "errors": [
                        {
                            "resource": "IssueComment",
                            "code": "custom",
                            "field": "body",
                            "message": f"body is too long (maximum is {MAX_COMMENT} characters)",
                        }
                    ],
                    "documentation_url": DOCS,
                },
            )
            return None
        return str(body["body"])

    def _create_comment(self, h: BaseHTTPRequestHandler, rec: Recorded, number: str) -> None:
        if rec.query:
            return self._violation(h, rec, 422, "POST comments takes no query parameters")
        if int(number) not in self.comments:
            return self._send(h, rec, 404, {"message": "Not Found", "documentation_url": DOCS})
        text = self._check_body(h, rec)
        if text is None or self._write_denied(h, rec):
            return
        comment = self._comment(int(number), text, self.identity)
        self.comments[int(number)].append(comment)
        self._send(h, rec, 201, comment, {"Location": comment["url"]})

    def _update_comment(self, h: BaseHTTPRequestHandler, rec: Recorded, cid: str) -> None:
        if rec.query:
            return self._violation(h, rec, 422, "PATCH comment takes no query parameters")
        for comments in self.comments.values():
            for comment in comments:
                if comment["id"] == int(cid):
                    text = self._check_body(h, rec)
                    if text is None or self._write_denied(h, rec):
                        return
                    comment["body"] = text
                    comment["updated_at"] = _now()
                    return self._send(h, rec, 200, comment)
        self._send(h, rec, 404, {"message": "Not Found", "documentation_url": DOCS})

    def _delete_comment(self, h: BaseHTTPRequestHandler, rec: Recorded, cid: str) -> None:
        if rec.query or rec.body is not None:
            return self._violation(h, rec, 422, "DELETE comment takes no query and no body")
        for comments in self.comments.values():
            for comment in comments:
                if comment["id"] == int(cid):
                    if self._write_denied(h, rec):
                        return
                    comments.remove(comment)
                    return self._send(h, rec, 204)
        self._send(h, rec, 404, {"message": "Not Found", "documentation_url": DOCS})
