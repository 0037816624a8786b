"""Test helpers that ship with yeto-core, for yeto's own tests and for plugin authors.

Importing this package imports nothing else. ``store_contract`` imports pytest,
so only test code imports it; nothing in ``yeto_core`` outside this package
imports pytest. Subclass the abstract contract classes in your plugin's tests
and provide their fixtures, as with fsspec's ``tests/abstract``:

.. code-block:: python

    from yeto_core.testing.store_contract import ObjectStoreContract

    class TestMyStore(ObjectStoreContract):
        @pytest.fixture
        def store(self, tmp_path):
            return MyStore(...)  # a fresh, empty store for each test
"""
