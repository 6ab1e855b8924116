"""A real local cluster (`tessera up`) shared by the tests of a session."""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest

from tessera import Client, LocalCluster
from tessera.fsspec import TesseraFileSystem


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(servers=3, memory="512MiB") as c:
        yield c


@pytest.fixture(scope="session")
def client(cluster: LocalCluster) -> Client:
    return cluster.client()


@pytest.fixture
def fs(cluster: LocalCluster) -> TesseraFileSystem:
    return cluster.fs(skip_instance_cache=True)


@pytest.fixture
def base(client: Client) -> Iterator[str]:
    """A fresh directory for one test, removed afterwards."""
    path = f"/t-{uuid.uuid4().hex[:12]}"
    client.mkdir(path)
    yield path
    if client.exists(path):
        client.rm(path, recursive=True)
