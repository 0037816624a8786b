"""SkyPilot offline: an isolated HOME with a small seeded catalog, no API server, no network.

SkyPilot computes its catalog directory when ``sky`` is first imported, so
every test here runs with HOME pointing at one session directory (the seeded
catalog lives there) and with ``SKYPILOT_DISABLE_LOCAL_API_SERVER=1``. A guard
refuses any connection that is not to 127.0.0.1 (or a Unix socket) while a
test of this folder runs, so no SkyPilot call can reach the network.
"""

from __future__ import annotations

import socket
import sys
import textwrap
from pathlib import Path

import pytest

# the seam's double (sky_double.py) and the probe island import from this folder
sys.path.insert(0, str(Path(__file__).parent))

CATALOG_VERSION = "v8"  # sky.skylet.constants.CATALOG_SCHEMA_VERSION in SkyPilot 0.14

ACCELERATORS_CSV = """\
AcceleratorName,Clouds
A100,"AWS, GCP"
A100-80GB,"AWS, GCP"
H100,"AWS, GCP"
L4,"AWS, GCP"
T4,"AWS, GCP"
"""
METADATA_CSV = """\
GPU,MemoryGB,Manufacturer
A100,40,NVIDIA
A100-80GB,80,NVIDIA
H100,80,NVIDIA
L4,24,NVIDIA
T4,16,NVIDIA
"""
# A few rows in SkyPilot's vms.csv layout (prices are made up for the tests).
AWS_VMS_CSV = """\
InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone
g6.xlarge,L4,1.0,4.0,16.0,,0.8,0.31,us-east-1,us-east-1a
g6.2xlarge,L4,1.0,8.0,32.0,,0.98,0.4,us-east-1,us-east-1a
g6.xlarge,L4,1.0,4.0,16.0,,0.9,0.35,us-west-2,us-west-2a
p4d.24xlarge,A100,8.0,96.0,1152.0,,32.77,9.83,us-east-1,us-east-1a
m6i.xlarge,,,4.0,16.0,,0.192,0.07,us-east-1,us-east-1a
"""


def seed_catalog(home: Path) -> Path:
    root = home / ".sky" / "catalogs" / CATALOG_VERSION
    (root / "common").mkdir(parents=True, exist_ok=True)
    (root / "aws").mkdir(parents=True, exist_ok=True)
    (root / "common" / "accelerators.csv").write_text(ACCELERATORS_CSV)
    (root / "common" / "metadata.csv").write_text(METADATA_CSV)
    (root / "aws" / "vms.csv").write_text(AWS_VMS_CSV)
    return root


@pytest.fixture(scope="session")
def sky_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("sky-home")
    seed_catalog(home)
    return home


_real_connect = socket.socket.connect


def _guarded_connect(self, address):
    if self.family == socket.AF_UNIX or (
        isinstance(address, tuple) and address[0] in ("127.0.0.1", "::1", "localhost")
    ):
        return _real_connect(self, address)
    raise OSError(f"tests/sky: network access to {address!r} refused (offline test)")


@pytest.fixture(autouse=True)
def offline_sky(sky_home, monkeypatch):
    monkeypatch.setenv("HOME", str(sky_home))
    monkeypatch.setenv("SKYPILOT_DISABLE_LOCAL_API_SERVER", "1")
    monkeypatch.setenv("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    yield sky_home


def toml(text: str) -> str:
    return textwrap.dedent(text).lstrip()
