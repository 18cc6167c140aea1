"""Real object-store emulators beside SeaweedFS (tests/s3_server.py): Azurite, the Azure Blob
Storage emulator (npm, installed under tests/emulators by the README's test command), on a
free loopback port, in memory. No mocks: obstore's AzureStore talks to it as to Azure."""

from __future__ import annotations

import base64
import hashlib
import hmac
import shutil
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Azurite:
    """A running Azurite blob service."""

    endpoint: str
    proc: subprocess.Popen[bytes]

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
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 201, answer.status
        return f"az://{name}"

    def stop(self) -> None:
        stop_process(self.proc)


def start_azurite(binary: str) -> Azurite:
    """Azurite's blob service in memory on a free loopback port, once it accepts connections."""
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
         "--silent", "--skipApiVersionCheck"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError(f"azurite exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return Azurite(f"http://127.0.0.1:{port}", proc)
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("azurite did not accept connections within 30 s")
