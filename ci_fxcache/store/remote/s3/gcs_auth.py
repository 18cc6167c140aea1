"""GCS access tokens from the credential files obstore's own GCS client cannot read: above
all the `external_account` file google-github-actions/auth leaves in
GOOGLE_APPLICATION_CREDENTIALS by default (Workload Identity Federation: GitHub's OIDC token
traded at Google's STS, then, when the file names one, for a service account's token).

google-auth (the `gcs` extra) reads the file and makes the trade; it is imported here only,
and only when such a file is the job's credential. The provider hands obstore each token with
its expiry and makes a new one shortly before that, so a token never runs out in a long job.
Every trade is bounded in time, and no message of this module carries a token or a header
value of the file.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

FILE_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
# The file kinds obstore's GCS client reads itself (its application default credentials).
OBSTORE_READS = ("service_account", "authorized_user")
# obstore's own GCS credentials: when one is set, the file is not what it uses.
OWN_CREDENTIALS = (
    "GOOGLE_BEARER_TOKEN",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
)
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
# A token is replaced this long before it expires (google-auth's own margin, rounded up).
RENEW_BEFORE = timedelta(minutes=4)
# How long a token whose answer gave no expiry is used (then one trade more, not one per
# request).
UNDATED = RENEW_BEFORE + timedelta(minutes=10)
EXTRA = "pip install 'ci-fxcache[gcs]'; the action installs it for store: object"
# Shapes of a token in a message: a JWT (GitHub's OIDC token: its header is base64 of `{"`),
# a bearer value and Google's access tokens.
_SECRET_SHAPES = re.compile(r"eyJ[\w-]*\.[\w-]*\.[\w-]*|(?i:bearer)\s+\S+|ya29\.[\w.-]+")


class TokenRefused(Exception):
    """The credentials file gave no access token (its message is safe to show)."""


def foreign_file(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The content of GOOGLE_APPLICATION_CREDENTIALS when that file is the job's GCS
    credential and obstore cannot read it (read once: what TokenProvider uses); None
    otherwise. TokenRefused (naming the variable and the path) for a file that cannot be read
    or is no JSON object with a `type`, which obstore reports as a bare `GenericError`."""
    path = env.get(FILE_ENV)
    if not path or any(env.get(name) for name in OWN_CREDENTIALS):
        return None
    try:
        with open(path, "rb") as f:
            info = json.loads(f.read(1 << 20))
    except OSError as exc:
        raise TokenRefused(f"{FILE_ENV} ({path}) cannot be read: {exc.strerror}") from None
    except (ValueError, RecursionError):
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("type"), str):
        raise TokenRefused(
            f"{FILE_ENV} ({path}) is not a credentials file (a JSON object with a type)"
        )
    return None if info["type"] in OBSTORE_READS else info


def kind_of(info: Mapping[str, Any]) -> str:
    """The file's `type`, as messages show it."""
    return str(info["type"])[:40]


class TokenProvider:
    """obstore's `credential_provider` for GCS over google-auth's credentials of `info` (a
    file foreign_file read): `{"token", "expires_at"}`, a new token when the last is within
    RENEW_BEFORE of its expiry; each trade (up to three requests) bounded by `seconds` in
    all. ImportError without google-auth; TokenRefused for a file google-auth cannot use."""

    def __init__(self, info: dict[str, Any], seconds: float) -> None:
        import google.auth
        from google.auth.transport.requests import Request

        self._kind = kind_of(info)
        self._seconds = seconds
        self._lock = threading.Lock()
        self._request = Request()
        self._expires: datetime | None = None  # of the token held (none yet)
        self._secrets = _header_values(info)
        try:
            if info["type"] == "external_account":
                self._credentials = _external_account(info)
            else:
                self._credentials, _ = google.auth.load_credentials_from_dict(info, scopes=[SCOPE])
        except Exception as exc:  # google-auth's DefaultCredentialsError, a malformed field
            raise TokenRefused(self._failed("cannot be used", exc)) from None

    def __call__(self) -> dict[str, Any]:
        with self._lock:
            if self._expires is None or self._expires - datetime.now(UTC) < RENEW_BEFORE:
                self._refresh()
                expiry = self._credentials.expiry  # naive UTC; None: the answer gave none
                self._expires = (
                    expiry.replace(tzinfo=UTC) if expiry else datetime.now(UTC) + UNDATED
                )
            return {"token": self._credentials.token, "expires_at": self._expires}

    def _refresh(self) -> None:
        end = time.monotonic() + self._seconds

        def bounded(*args: Any, **kwargs: Any) -> Any:
            kwargs["timeout"] = max(0.05, end - time.monotonic())
            return self._request(*args, **kwargs)

        try:
            self._credentials.refresh(bounded)
        except Exception as exc:  # RefreshError, TransportError, a malformed answer
            raise TokenRefused(self._failed("gave no access token", exc)) from None

    def _failed(self, what: str, exc: BaseException) -> str:
        """One line: which file kind failed and google-auth's reason, tokens and the file's
        header values blanked, at most 240 characters of it."""
        first = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
        reason = _SECRET_SHAPES.sub("***", " ".join(first.split()))
        for secret in self._secrets:
            reason = reason.replace(secret, "***")
        reason = reason[:240]
        return f"{FILE_ENV} ({self._kind} credentials) {what}: {type(exc).__name__}: {reason}"


def _external_account(info: dict[str, Any]) -> Any:
    """google-auth's credentials for an `external_account` file, of the kind its own loader
    picks (AWS, an executable, else a token from a file or URL), without the project lookup
    that loader makes (one more trade and a Cloud Resource Manager request, which a bucket
    never needs and the account may not be allowed)."""
    from google.auth import aws, identity_pool, pluggable

    source = info.get("credential_source")
    kind: Any = identity_pool.Credentials
    if info.get("subject_token_type") == "urn:ietf:params:aws:token-type:aws4_request":
        kind = aws.Credentials
    elif isinstance(source, dict) and source.get("executable") is not None:
        kind = pluggable.Credentials
    return kind.from_info(info, scopes=[SCOPE])


def _header_values(info: dict[str, Any]) -> list[str]:
    """The values of the file's credential_source headers (GitHub's token request token),
    each blanked in any message; the longest first."""
    source = info.get("credential_source")
    headers = source.get("headers") if isinstance(source, dict) else None
    if not isinstance(headers, dict):
        return []
    values: set[str] = set()
    for value in headers.values():
        if isinstance(value, str):  # the value, and a credential after its scheme ("Bearer ")
            values.update((value.strip(), value.split(None, 1)[-1].strip()))
    return sorted((v for v in values if len(v) >= 4), key=len, reverse=True)
