"""A small GitLab REST (v4) client for the merge-request note: one session, GitLab's token
header, `Link: rel="next"` pagination (with `X-Next-Page` as GitLab's fallback), one retry
on a 5xx or 429 answer. The token is never printed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ci_fxcache import __version__
from ci_fxcache.errors import FxcacheError, UsageError

if TYPE_CHECKING:
    import requests

# GitLab takes a personal, project or group access token in PRIVATE-TOKEN and the job's
# CI_JOB_TOKEN in JOB-TOKEN (which the notes API refuses: docs/other-ci.md).
JOB_TOKEN_ENV = "CI_JOB_TOKEN"


class GitLabError(FxcacheError):
    """A request that failed for good; `status` is the HTTP status (0 for no answer)."""

    exit_code = 1

    def __init__(self, status: int, method: str, path: str, message: str) -> None:
        super().__init__(f"GitLab API {method} {path} -> {status or 'no answer'}: {message}")
        self.status = status


def _message(response: requests.Response) -> str:
    """GitLab's error text: `message` (a string, a list or a dict of field errors) or `error`."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200] or response.reason
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or response.reason)[:300]
    return response.reason


class GitLabClient:
    """Authenticated access to GitLab's REST API v4 at `api_url` (CI_API_V4_URL)."""

    def __init__(
        self,
        token: str,
        api_url: str,
        *,
        job_token: bool = False,
        timeout_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        import requests

        if not token:
            raise UsageError("no GitLab token")
        if not api_url.startswith(("http://", "https://")):
            raise UsageError(f"GitLab API URL {api_url!r} is not http(s) (CI_API_V4_URL)")
        self.api_url = api_url.rstrip("/")
        self.timeout_s = timeout_s
        self._sleep = sleep
        self._session = requests.Session()
        header = "JOB-TOKEN" if job_token else "PRIVATE-TOKEN"
        self._session.headers.update({header: token, "User-Agent": f"fxcache/{__version__}"})

    def request(self, method: str, path_or_url: str, **kwargs: Any) -> requests.Response:
        """Send a request (one retry on 5xx / 429); the 2xx response, or GitLabError."""
        import requests

        url = path_or_url if "://" in path_or_url else self.api_url + path_or_url
        path = urlsplit(url).path
        kwargs.setdefault("timeout", self.timeout_s)
        for attempt in (0, 1):
            try:
                response = self._session.request(method, url, **kwargs)
            except requests.RequestException as exc:
                if attempt:
                    raise GitLabError(0, method, path, type(exc).__name__) from None
                self._sleep(1.0)
                continue
            if response.status_code < 300:
                return response
            if attempt or not (response.status_code >= 500 or response.status_code == 429):
                raise GitLabError(response.status_code, method, path, _message(response))
            self._sleep(1.0)
        raise AssertionError("unreachable")

    def paginate(self, path: str) -> Iterator[dict[str, Any]]:
        """Every item of every page (`per_page=100`), following `Link: rel="next"`."""
        response = self.request("GET", path, params={"per_page": 100})
        while True:
            yield from response.json()
            next_url = response.links.get("next", {}).get("url")
            next_page = response.headers.get("X-Next-Page", "")
            if next_url:
                response = self.request("GET", next_url)
            elif next_page:
                response = self.request("GET", path, params={"per_page": 100, "page": next_page})
            else:
                return
