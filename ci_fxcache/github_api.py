"""A small GitHub REST client (requests) shared by cache cleanup and PR comments.

It sends GitHub's documented headers, follows `Link: rel="next"` pagination, retries 5xx with
exponential backoff, and waits out rate limits (`Retry-After`, `x-ratelimit-reset`) within a
bound. The token is never printed; inside Actions it is masked.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ci_fxcache import __version__, gha
from ci_fxcache.errors import FxcacheError, UsageError

if TYPE_CHECKING:
    import requests

API_VERSION = "2022-11-28"
DEFAULT_API_URL = "https://api.github.com"


class GitHubError(FxcacheError):
    """A request that failed for good; `status` is the HTTP status (0 for no answer)."""

    exit_code = 1

    def __init__(self, status: int, method: str, path: str, message: str) -> None:
        super().__init__(f"GitHub API {method} {path} -> {status or 'no answer'}: {message}")
        self.status = status
        self.method = method
        self.path = path
        self.api_message = message


def _api_message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200] or response.reason
    if isinstance(body, dict):
        message = str(body.get("message", response.reason))
        details = [
            str(e.get("message") or e.get("code"))
            for e in body.get("errors", [])
            if isinstance(e, dict)
        ]
        return "; ".join([message, *details]) if details else message
    return response.reason


class GitHubClient:
    """Authenticated access to one repository's REST API."""

    def __init__(
        self,
        token: str,
        repository: str,
        api_url: str | None = None,
        *,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        max_wait_s: float = 120.0,
        timeout_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        import requests

        if not token:
            raise UsageError("no GitHub token: set GITHUB_TOKEN (or the action's github-token)")
        if repository.count("/") != 1 or not all(repository.split("/")):
            raise UsageError(f"repository {repository!r} is not OWNER/NAME (GITHUB_REPOSITORY)")
        gha.mask(token)
        self.repository = repository
        self.api_url = (api_url or DEFAULT_API_URL).rstrip("/")
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_wait_s = max_wait_s
        self.timeout_s = timeout_s
        self._sleep = sleep
        self._session = requests.Session()
        self._session.headers.update(
            {
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
                "Authorization": f"Bearer {token}",
                "User-Agent": f"fxcache/{__version__}",
            }
        )

    @classmethod
    def from_env(
        cls, token_env: str = "GITHUB_TOKEN", token: str | None = None, **kwargs: Any
    ) -> GitHubClient:
        """Client configured from the Actions environment (repository, API URL; the token
        when `token` is not given)."""
        repository = os.environ.get("GITHUB_REPOSITORY", "")
        if not repository:
            raise UsageError("GITHUB_REPOSITORY is not set: run inside Actions or export it")
        return cls(
            os.environ.get(token_env, "") if token is None else token,
            repository,
            os.environ.get("GITHUB_API_URL") or DEFAULT_API_URL,
            **kwargs,
        )

    @property
    def graphql_url(self) -> str:
        """The GraphQL endpoint beside the REST API (GitHub Enterprise Server: /api/graphql)."""
        if self.api_url.endswith("/api/v3"):
            return self.api_url[: -len("/v3")] + "/graphql"
        return self.api_url + "/graphql"

    def graphql(self, query: str) -> dict[str, Any]:
        """The `data` of a GraphQL query; GitHubError when GitHub answers with `errors`."""
        response = self.request("POST", self.graphql_url, json={"query": query})
        body = response.json()
        errors = body.get("errors") if isinstance(body, dict) else None
        if errors or not isinstance(body, dict) or not isinstance(body.get("data"), dict):
            text = "; ".join(str(e.get("message", e)) for e in errors or [] if isinstance(e, dict))
            raise GitHubError(response.status_code, "POST", "/graphql", text or "no data")
        return dict(body["data"])

    def repo_path(self, suffix: str) -> str:
        """`/repos/{owner}/{repo}` + suffix."""
        return f"/repos/{self.repository}/{suffix.lstrip('/')}"

    def _wait_for(self, response: requests.Response, attempt: int) -> float | None:
        """Seconds to wait before retrying `response`, or None when it is final."""
        status = response.status_code
        headers = response.headers
        if status in (403, 429):
            if "Retry-After" in headers:
                try:
                    return max(0.0, float(headers["Retry-After"]))
                except ValueError:
                    return self.backoff_s * 2**attempt
            if headers.get("x-ratelimit-remaining") == "0" and "x-ratelimit-reset" in headers:
                try:
                    return max(0.0, float(headers["x-ratelimit-reset"]) - time.time()) + 1.0
                except ValueError:
                    return self.backoff_s * 2**attempt
            if status == 429:
                return self.backoff_s * 2**attempt
            return None  # a plain 403 is a permission answer, not a rate limit
        if status >= 500:
            return self.backoff_s * 2**attempt
        return None

    def request(self, method: str, path_or_url: str, **kwargs: Any) -> requests.Response:
        """Send a request with retries; return the final 2xx response or raise GitHubError."""
        import requests

        url = path_or_url if "://" in path_or_url else self.api_url + path_or_url
        path = urlsplit(url).path
        kwargs.setdefault("timeout", self.timeout_s)
        attempt = 0
        while True:
            try:
                response = self._session.request(method, url, **kwargs)
            except requests.RequestException as exc:
                if attempt >= self.max_retries:
                    raise GitHubError(0, method, path, type(exc).__name__) from exc
                self._sleep(self.backoff_s * 2**attempt)
                attempt += 1
                continue
            if response.status_code < 300:
                return response
            wait = self._wait_for(response, attempt)
            if wait is None or attempt >= self.max_retries or wait > self.max_wait_s:
                raise GitHubError(response.status_code, method, path, _api_message(response))
            self._sleep(wait)
            attempt += 1

    def paginate(
        self, path: str, params: dict[str, Any] | None = None, item_key: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Yield the items of every page (`per_page=100`), following `Link: rel="next"`."""
        query = {"per_page": 100, **(params or {})}
        response = self.request("GET", path, params=query)
        while True:
            body = response.json()
            items = body[item_key] if item_key else body
            yield from items
            next_url = response.links.get("next", {}).get("url")
            if not next_url:
                return
            response = self.request("GET", next_url)
