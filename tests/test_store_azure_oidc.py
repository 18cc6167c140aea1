"""Azure through GitHub's OIDC token, as docs/store.md tells a user to set it up: no account
key, `AZURE_CLIENT_ID`, `AZURE_TENANT_ID` and `AZURE_FEDERATED_TOKEN_FILE` (the token
`azure/login` or a step of the user's leaves in a file), which obstore trades for an access
token at Microsoft Entra ID's token endpoint, then sends as a bearer token.

The endpoint is a stand-in over HTTPS (`AZURE_AUTHORITY_HOST`), answering the client
credentials grant with a federated assertion as Microsoft's identity platform documents it;
the account is Azurite over HTTPS with OAuth on (it checks a token's issuer, audience and
times, not its signature), at `AZURE_STORAGE_ENDPOINT`; both are trusted through
`SSL_CERT_FILE`, which obstore reads like the runner's system certificates. Not covered: the
trade at Microsoft itself, and the Azure CLI path (`AZURE_USE_AZURE_CLI`)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pytest

from tests.conftest import RunFxcache
from tests.local_server import LocalServer, certificates
from tests.store_helpers import Store, unsigned_jwt, write_files

pytest.importorskip("obstore.store")
FILES = {f"inductor/fxgraph/o{i}/entry": f"graph {i} ".encode() * (30 + i) for i in range(4)}
TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
CLIENT = "0f6bd9a1-5a5e-4bb0-8c3c-6f2d64f1c7e2"
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


class _Entra(LocalServer):
    """`POST /{tenant}/oauth2/v2.0/token`: the client credentials grant with a federated
    assertion (client_id, client_assertion, its type, scope). For the one assertion it knows
    it answers an access token for Azure Storage (issuer sts.windows.net/{tenant}, audience
    storage.azure.com, valid for an hour); for any other, `invalid_client` (HTTP 401)."""

    def __init__(self, assertion: str, tls: tuple[Path, Path]) -> None:
        super().__init__(tls)
        self.assertion = assertion
        self.calls: list[dict[str, str]] = []
        self.issued: list[str] = []

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        form = dict(parse_qsl(h.rfile.read(int(h.headers.get("Content-Length") or 0)).decode()))
        with self._lock:
            self.calls.append({**form, "method": h.command, "path": h.path})
        known = (h.command == "POST" and h.path == f"/{TENANT}/oauth2/v2.0/token"
                 and form.get("grant_type") == "client_credentials"
                 and form.get("client_id") == CLIENT
                 and form.get("client_assertion_type") == ASSERTION_TYPE
                 and form.get("client_assertion") == self.assertion
                 and form.get("scope") == "https://storage.azure.com/.default")  # fmt: skip
        if known:
            now = int(time.time())
            token = unsigned_jwt({"aud": "https://storage.azure.com",
                                   "iss": f"https://sts.windows.net/{TENANT}/", "tid": TENANT,
                                   "nbf": now - 60, "iat": now - 60, "exp": now + 3600,
                                   "oid": str(uuid.uuid4())})  # fmt: skip
            with self._lock:
                self.issued.append(token)
            status, answer = 200, {"token_type": "Bearer", "expires_in": 3599,
                                   "ext_expires_in": 3599, "access_token": token}  # fmt: skip
        else:
            status, answer = 401, {"error": "invalid_client",
                                   "error_description": "AADSTS700213: No matching federated "
                                                        "identity record found."}  # fmt: skip
        self.answer_json(h, status, answer)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def azurite_https(tls: tuple[Path, Path, Path]) -> Iterator[Any]:
    from tests import object_servers

    binary = object_servers.installed(object_servers.azurite_binary(), "Azurite",
                                      "npm ci --prefix tests/emulators")  # fmt: skip
    server = object_servers.start_azurite(binary, tls)
    yield server
    server.stop()


def test_a_federated_token_reaches_the_account_through_entra_id(
    tmp_path: Path, run_fxcache: RunFxcache, azurite_https: Any, tls: tuple[Path, Path, Path]
) -> None:
    """A save and an empty runner's restore with the federated token alone (no key): each
    runner trades it once, and Azurite takes the access token it got. A token the endpoint
    does not know is one warning, the local store only, and neither token in any output."""
    from tests.object_servers import AZURITE_ACCOUNT

    ca, cert, key = tls
    github_token = unsigned_jwt({"iss": "https://token.actions.githubusercontent.com",
                                  "sub": "repo:acme/models:ref:refs/heads/main",
                                  "aud": "api://AzureADTokenExchange"})  # fmt: skip
    (tmp_path / "oidc-token").write_text(github_token)
    url = azurite_https.make_container(f"t{uuid.uuid4().hex[:16]}") + "/fleet/ci"
    with _Entra(github_token, (cert, key)) as entra:
        env = {
            "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
            "AZURE_STORAGE_ENDPOINT": f"{azurite_https.endpoint}/{AZURITE_ACCOUNT}",
            "AZURE_CLIENT_ID": CLIENT,
            "AZURE_TENANT_ID": TENANT,
            "AZURE_FEDERATED_TOKEN_FILE": str(tmp_path / "oidc-token"),
            "AZURE_AUTHORITY_HOST": entra.url,
            "SSL_CERT_FILE": str(ca),
        }
        a, b = (Store(tmp_path / n / "root", run_fxcache, env) for n in "ab")
        first = a.restore("--store", "object", "--object-url", url)
        assert "warning" not in first["_stderr"], first["_stderr"]
        write_files(Path(first["inductor_dir"]).parent, FILES)
        proc = a.save()
        assert proc.returncode == 0 and json.loads(proc.stdout)["remote"]["published"], (
            proc.stdout + proc.stderr
        )
        got = b.restore("--store", "object", "--object-url", url)
        assert got["hit"] and got["remote"]["fetched"] and got["files"] == len(FILES), got
        for rel, body in FILES.items():
            assert (Path(got["scope_dir"]) / rel).read_bytes() == body
        assert entra.calls and all(c["client_assertion"] == github_token for c in entra.calls)
        outputs = [first["_stderr"], proc.stdout, proc.stderr, json.dumps(got)]
        assert not any(t in o for t in [github_token, *entra.issued] for o in outputs)

        (tmp_path / "other-token").write_text("eyJ.a-token-entra-does-not-know")
        other = {**env, "AZURE_FEDERATED_TOKEN_FILE": str(tmp_path / "other-token")}
        stranger = Store(tmp_path / "c" / "root", run_fxcache, other)
        cold = stranger.restore("--store", "object", "--object-url", url)
    warned = [line for line in cold["_stderr"].splitlines() if "warning" in line]
    assert not cold["hit"] and len(warned) == 1, cold["_stderr"]
    assert "continuing with the local store only" in warned[0]
    assert "a-token-entra-does-not-know" not in cold["_stderr"]
