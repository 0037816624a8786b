"""The example third-party plugin's ``memory`` store passes yeto's ObjectStore contract suite
(the recipe of docs/stores.md, as a plugin author would run it)."""

from __future__ import annotations

import uuid

import pytest
from yeto_example_memory import MemoryStore

from yeto_core.testing.store_contract import ObjectStoreContract


class TestMemoryStore(ObjectStoreContract):
    @pytest.fixture
    def store(self):
        return MemoryStore(f"contract-{uuid.uuid4().hex}")  # a fresh, empty space per test
