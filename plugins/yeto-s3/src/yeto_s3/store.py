"""The ``s3`` object store: any S3-compatible service (AWS S3, MinIO, Cloudflare R2, Nebius).

Credentials are explicit only: the store options ``access_key_id`` and
``secret_access_key`` (optionally ``session_token``), else the environment
variables ``YETO_STORE_S3_ACCESS_KEY_ID`` / ``YETO_STORE_S3_SECRET_ACCESS_KEY``
(``YETO_STORE_S3_SESSION_TOKEN``). ``endpoint_url`` and ``region`` come the same
way (``YETO_STORE_S3_ENDPOINT_URL``, ``YETO_STORE_S3_REGION``). The client is
built from a botocore session that reads no ``AWS_*`` variable, no ``~/.aws``
file and no instance metadata, so the default AWS credential chain is never
consulted.

``put_if_absent`` is ``put_object(IfNoneMatch="*")`` (S3 conditional writes,
botocore >= 1.35.2): 412 ``PreconditionFailed`` means another writer created
the key first; 409 ``ConditionalRequestConflict`` (a concurrent conditional
write in flight) is retried with backoff. Each conditional write carries a
random token in its metadata, so when a transient error hides whether an
attempt landed, a later 412 is resolved by reading the token back.

Transient failures (connection errors, timeouts, 5xx, throttling) are retried
by this module with bounded, jittered exponential backoff; botocore's own
retries are off so that the ambiguity above is handled in one place.
"""

from __future__ import annotations

import functools
import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Any, Optional, TypeVar
from urllib.parse import urlsplit

import botocore.configprovider
import botocore.exceptions
import botocore.loaders
import botocore.session
from botocore.config import Config

from yeto_core.errors import ConfigError, InvalidKeyError, NotFoundError, StoreError
from yeto_core.ports import ObjectStore
from yeto_core.stores.keys import check_key, check_prefix

T = TypeVar("T")

ENV = {
    "access_key_id": "YETO_STORE_S3_ACCESS_KEY_ID",
    "secret_access_key": "YETO_STORE_S3_SECRET_ACCESS_KEY",
    "session_token": "YETO_STORE_S3_SESSION_TOKEN",
    "endpoint_url": "YETO_STORE_S3_ENDPOINT_URL",
    "region": "YETO_STORE_S3_REGION",
    # "sorted" for servers that list in directory-tree order (SeaweedFS); islands inherit it
    "list_order": "YETO_STORE_S3_LIST_ORDER",
}
OPTIONS = (
    "access_key_id",
    "secret_access_key",
    "session_token",
    "endpoint_url",
    "region",
    "addressing_style",
    "max_attempts",
    "connect_timeout",
    "read_timeout",
    "max_pool_connections",
    "list_order",
)
#: ``list_order`` values: ``"s3"`` trusts the server to list in S3's key order
#: (AWS S3, R2, MinIO; checked while listing), ``"sorted"`` lists the whole
#: prefix and sorts it here (servers that list in directory-tree order, such as
#: SeaweedFS, where ``a/b`` comes before ``a-b``).
LIST_ORDERS = ("s3", "sorted")
DEFAULT_REGION = "us-east-1"
MAX_KEY_BYTES = 1024
TOKEN_META = "yeto-put-token"

_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "RequestTimeout",
        "RequestTimeoutException",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "BandwidthLimitExceeded",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    }
)
_TRANSIENT_EXC = (
    botocore.exceptions.ConnectionError,
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.IncompleteReadError,
)


@functools.lru_cache(maxsize=1)
def _shared_loader() -> Any:
    """One service-model loader per process (building a client is then cheap)."""
    return botocore.loaders.create_loader()


def _isolated_session() -> botocore.session.Session:
    """A botocore session that reads nothing from the environment or ``~/.aws``."""
    session_vars = {
        name: (config_key, None, default, converter)
        for name, (
            config_key,
            _env,
            default,
            converter,
        ) in botocore.configprovider.BOTOCORE_DEFAUT_SESSION_VARIABLES.items()
    }
    session_vars["config_file"] = (None, None, os.devnull, None)
    session_vars["credentials_file"] = (None, None, os.devnull, None)
    session_vars["ignore_configured_endpoint_urls"] = (None, None, True, None)
    session = botocore.session.Session(session_vars=session_vars)
    session.register_component("data_loader", _shared_loader())
    return session


def make_client(
    *,
    access_key_id: str,
    secret_access_key: str,
    session_token: Optional[str] = None,
    endpoint_url: Optional[str] = None,
    region: Optional[str] = None,
    addressing_style: Optional[str] = None,
    connect_timeout: float = 10.0,
    read_timeout: float = 60.0,
    max_pool_connections: int = 32,
) -> Any:
    """An S3 client with exactly these credentials (never the default AWS chain)."""
    if not access_key_id or not secret_access_key:
        raise ConfigError(missing_credentials_message("the s3 client"))
    if addressing_style is None:
        addressing_style = "path" if endpoint_url else "auto"
    config = Config(
        retries={"total_max_attempts": 1},  # retried here, see module docstring
        s3={"addressing_style": addressing_style},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_pool_connections=max_pool_connections,
    )
    return _isolated_session().create_client(
        "s3",
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        aws_session_token=session_token or None,
        endpoint_url=endpoint_url or None,
        region_name=region or DEFAULT_REGION,
        config=config,
    )


def missing_credentials_message(where: str) -> str:
    return (
        f"{where}: no S3 credentials. Set {ENV['access_key_id']} and "
        f"{ENV['secret_access_key']} (and {ENV['endpoint_url']} / {ENV['region']} for "
        "MinIO, R2 or other S3-compatible services), or give the store options "
        "access_key_id and secret_access_key. yeto never uses the default AWS credential "
        "chain (AWS_* variables, ~/.aws, instance metadata)."
    )


def _error_code(exc: BaseException) -> tuple[str, int]:
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {}) or {}
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
        return str(err.get("Code", "")), int(status)
    return "", 0


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying (network trouble, 5xx, throttling)."""
    if isinstance(exc, _TRANSIENT_EXC):
        return True
    if isinstance(exc, botocore.exceptions.ClientError):
        code, status = _error_code(exc)
        return code in _TRANSIENT_CODES or status >= 500 or status == 429
    return False


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` → ``("bucket", "some/prefix/")`` (root ``""`` if none)."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ConfigError(f"not an S3 URL: {url!r}; write s3://BUCKET/PREFIX")
    if parts.query or parts.fragment:
        raise ConfigError(f"S3 URL {url!r} has a query or fragment; give store options instead")
    prefix = parts.path.strip("/")
    if prefix:
        try:
            check_key(prefix)
        except InvalidKeyError as exc:
            raise ConfigError(f"S3 URL {url!r} has an invalid prefix: {exc}") from None
        prefix += "/"
    return parts.netloc, prefix


def _valid_key(key: str) -> bool:
    try:
        check_key(key)
    except InvalidKeyError:
        return False
    return True


class S3Store(ObjectStore):
    """Objects under ``s3://bucket/prefix`` (keys are relative to the prefix)."""

    PLUGIN_NAME = "s3"
    URL_SCHEMES = ("s3",)

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: Any,
        endpoint_url: Optional[str] = None,
        region: Optional[str] = None,
        max_attempts: int = 6,
        backoff_base: float = 0.05,
        backoff_cap: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
        seed: Optional[int] = None,
        secrets: tuple[str, ...] = (),
        list_order: str = "s3",
    ) -> None:
        if max_attempts < 1:
            raise ConfigError(f"s3 store max_attempts must be >= 1, got {max_attempts}")
        if list_order not in LIST_ORDERS:
            raise ConfigError(
                f"s3 store list_order must be one of {list(LIST_ORDERS)}, got {list_order!r}"
            )
        self.list_order = list_order
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint_url = endpoint_url
        self.region = region
        self.max_attempts = int(max_attempts)
        self._client = client
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._secrets = tuple(s for s in secrets if s)
        self._credentials_env: dict[str, str] = {}

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Store:
        """Open ``s3://bucket/prefix``; options override the ``YETO_STORE_S3_*`` variables."""
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ConfigError(
                f"unknown s3 store option(s) {unknown} for {url!r}; allowed: {list(OPTIONS)}"
            )
        bucket, prefix = parse_s3_url(url)

        def opt(name: str) -> Optional[str]:
            value = options.get(name)
            if value is None or value == "":
                value = os.environ.get(ENV[name]) or None
            return value

        access_key_id, secret = opt("access_key_id"), opt("secret_access_key")
        if not access_key_id or not secret:
            raise ConfigError(missing_credentials_message(f"s3 store {url!r}"))
        session_token = opt("session_token")
        endpoint_url, region = opt("endpoint_url"), opt("region")
        client = make_client(
            access_key_id=access_key_id,
            secret_access_key=secret,
            session_token=session_token,
            endpoint_url=endpoint_url,
            region=region,
            addressing_style=options.get("addressing_style"),
            connect_timeout=float(options.get("connect_timeout", 10.0)),
            read_timeout=float(options.get("read_timeout", 60.0)),
            max_pool_connections=int(options.get("max_pool_connections", 32)),
        )
        store = cls(
            bucket,
            prefix,
            client=client,
            endpoint_url=endpoint_url,
            region=region or DEFAULT_REGION,
            max_attempts=int(options.get("max_attempts", 6)),
            secrets=(secret, session_token or ""),
            list_order=str(opt("list_order") or "s3"),
        )
        store._credentials_env = {
            ENV[name]: value
            for name, value in (
                ("access_key_id", access_key_id),
                ("secret_access_key", secret),
                ("session_token", session_token),
                ("endpoint_url", endpoint_url),
                ("region", region),
                ("list_order", opt("list_order")),
            )
            if value
        }
        return store

    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def credentials_env(self) -> dict[str, str]:
        """The ``YETO_STORE_S3_*`` variables that open this store on another machine."""
        return dict(self._credentials_env)

    def __repr__(self) -> str:
        return (
            f"S3Store({self.url()!r}, endpoint_url={self.endpoint_url!r}, region={self.region!r})"
        )

    # -- helpers -----------------------------------------------------------------------

    def _key(self, key: str) -> str:
        full = self.prefix + check_key(key)
        if len(full.encode("utf-8")) > MAX_KEY_BYTES:
            raise InvalidKeyError(
                f"S3 key {full!r} is longer than {MAX_KEY_BYTES} bytes; use a shorter key"
            )
        return full

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def _redact(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

    def _fail(self, verb: str, key: str, exc: BaseException) -> StoreError:
        code, status = _error_code(exc)
        what = f"{code} (HTTP {status})" if code else type(exc).__name__
        hint = {
            "NoSuchBucket": "create the bucket or fix the URL",
            "AccessDenied": "check the credentials' permissions on this bucket and prefix",
            "InvalidAccessKeyId": f"check {ENV['access_key_id']} / access_key_id",
            "SignatureDoesNotMatch": f"check {ENV['secret_access_key']} / secret_access_key",
        }.get(code, "check the endpoint, bucket and network; transient errors were retried")
        detail = self._redact(str(exc))
        return StoreError(f"s3 {verb} {self._where(key)} failed: {what}: {detail}; {hint}")

    def _backoff(self, attempt: int) -> float:
        delay = min(self._backoff_cap, self._backoff_base * (2**attempt))
        return delay * (0.5 + 0.5 * self._rng.random())

    def _retrying(self, verb: str, key: str, fn: Callable[[], T]) -> T:
        """Call ``fn``, retrying transient errors; other errors propagate unchanged."""
        attempt = 0
        while True:
            try:
                return fn()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                attempt += 1
                if attempt >= self.max_attempts:
                    raise self._fail(verb, key, exc) from None
                self._sleep(self._backoff(attempt - 1))

    # -- port --------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        full = self._key(key)

        def once() -> bytes:
            resp = self._client.get_object(Bucket=self.bucket, Key=full)
            with resp["Body"] as body:
                return body.read()

        try:
            return self._retrying("get", key, once)
        except botocore.exceptions.ClientError as exc:
            code, status = _error_code(exc)
            if code in ("NoSuchKey", "404") or (status == 404 and code != "NoSuchBucket"):
                raise NotFoundError(f"no object {key!r} in {self.url()}") from None
            raise self._fail("get", key, exc) from None

    def put(self, key: str, data: bytes) -> None:
        full = self._key(key)
        body = bytes(data)
        try:
            self._retrying(
                "put",
                key,
                lambda: self._client.put_object(Bucket=self.bucket, Key=full, Body=body),
            )
        except botocore.exceptions.ClientError as exc:
            raise self._fail("put", key, exc) from None

    def raw_put(self, key: str, data: bytes) -> None:
        """A plain ``put_object`` (no retries): the baseline of ``yeto bench buffer``.

        The key is checked like every other write's: a baseline must not write
        what the store could never read back.
        """
        self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return (
            self._put_conditional(
                "put_if_absent",
                key,
                data,
                {"IfNoneMatch": "*"},
                "If-None-Match",
                "yeto's object-per-record buffer index needs them (AWS S3, MinIO, R2 and "
                "moto >= 5.2.1 have them)",
            )
            is not None
        )

    ATOMIC_CAS = True

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and its ETag (the version :meth:`put_if_match` compares)."""
        full = self._key(key)

        def once() -> tuple[bytes, str]:
            resp = self._client.get_object(Bucket=self.bucket, Key=full)
            with resp["Body"] as body:
                return body.read(), str(resp["ETag"])

        try:
            return self._retrying("get", key, once)
        except botocore.exceptions.ClientError as exc:
            code, status = _error_code(exc)
            if code in ("NoSuchKey", "404") or (status == 404 and code != "NoSuchBucket"):
                raise NotFoundError(f"no object {key!r} in {self.url()}") from None
            raise self._fail("get", key, exc) from None

    def put_if_match(self, key: str, data: bytes, version: Optional[str]) -> Optional[str]:
        """``put_object(IfMatch=version)`` (``IfNoneMatch="*"`` for None); the new ETag.

        A 412 means another writer changed the object: None. An attempt whose answer
        was lost (a timeout, a 5xx) and a later 412 is resolved like
        :meth:`put_if_absent`: by reading this call's token back.
        """
        cond = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        return self._put_conditional(
            "put_if_match",
            key,
            data,
            cond,
            "If-Match / If-None-Match",
            "the run's consumed state, pointers and head lease need them (AWS S3, MinIO, R2, "
            "SeaweedFS and moto >= 5.2.1 have them)",
        )

    def _put_conditional(
        self,
        verb: str,
        key: str,
        data: bytes,
        cond: dict[str, str],
        headers: str,
        needed_by: str,
    ) -> Optional[str]:
        """``put_object`` under ``cond``: the new ETag, or None when the condition failed.

        Every attempt carries one random token in the object's metadata. An attempt
        whose answer was lost (a timeout, a 5xx: retried) may have landed, so a later
        412 is resolved by reading the token back: the object holds ours (our write
        landed: its ETag) or another writer's (None). A 409 (a concurrent conditional
        write in flight) is retried with backoff; when it persists on a create, the
        winner has written by now, or nobody did (then it fails).
        """
        full = self._key(key)
        body = bytes(data)
        token = os.urandom(16).hex()
        ambiguous = False  # an earlier attempt may have landed without us seeing the answer
        transient = conflicts = 0
        while True:
            try:
                resp = self._client.put_object(
                    Bucket=self.bucket, Key=full, Body=body, Metadata={TOKEN_META: token}, **cond
                )
                return str(resp["ETag"])
            except Exception as exc:
                code, status = _error_code(exc)
                if code == "PreconditionFailed" or status == 412:
                    return self._token_etag(verb, key, full, token) if ambiguous else None
                if "IfMatch" in cond and (code in ("NoSuchKey", "404") or status == 404):
                    return None  # IfMatch on an object that is gone
                if code == "ConditionalRequestConflict" or status == 409:
                    conflicts += 1
                    if conflicts < self.max_attempts:
                        self._sleep(self._backoff(conflicts - 1))
                        continue
                    if "IfNoneMatch" in cond and self._exists_full(key, full):
                        return self._token_etag(verb, key, full, token)
                    raise self._fail(verb, key, exc) from None
                if is_transient(exc):
                    ambiguous = True
                    transient += 1
                    if transient >= self.max_attempts:
                        raise self._fail(verb, key, exc) from None
                    self._sleep(self._backoff(transient - 1))
                    continue
                if code == "NotImplemented" or status == 501:
                    raise StoreError(
                        f"s3 {verb} {self._where(key)}: the server does not support "
                        f"conditional writes ({headers}); {needed_by}"
                    ) from None
                raise self._fail(verb, key, exc) from None

    def _token_etag(self, verb: str, key: str, full: str, token: str) -> Optional[str]:
        """The object's ETag when it holds ``token`` (our write landed), else None."""
        try:
            head = self._retrying(
                verb, key, lambda: self._client.head_object(Bucket=self.bucket, Key=full)
            )
        except botocore.exceptions.ClientError as exc:
            _code, status = _error_code(exc)
            if status == 404:
                return None
            raise self._fail(verb, key, exc) from None
        if head.get("Metadata", {}).get(TOKEN_META) == token:
            return str(head["ETag"])
        return None

    def _exists_full(self, key: str, full: str) -> bool:
        try:
            self._retrying(
                "exists", key, lambda: self._client.head_object(Bucket=self.bucket, Key=full)
            )
            return True
        except botocore.exceptions.ClientError as exc:
            code, status = _error_code(exc)
            if status == 404 and code != "NoSuchBucket":
                return False
            raise self._fail("exists", key, exc) from None

    def exists(self, key: str) -> bool:
        return self._exists_full(key, self._key(key))

    def list(self, prefix: str = "", after: Optional[str] = None) -> Iterator[str]:
        check_prefix(prefix)
        if after is not None and not isinstance(after, str):
            raise TypeError(f"list(after=...) takes a key string or None, got {after!r}")
        return self._list(prefix, after)

    def _list(self, prefix: str, after: Optional[str]) -> Iterator[str]:
        if self.list_order == "sorted":
            keys = sorted(self._pages(prefix, None))
            return iter(keys if after is None else [k for k in keys if k > after])
        return self._in_order(prefix, self._pages(prefix, after))

    def _in_order(self, prefix: str, keys: Iterator[str]) -> Iterator[str]:
        """``keys`` as listed, checked to be in S3's order (every prefix scan relies on it)."""
        last: Optional[str] = None
        for key in keys:
            if last is not None and key <= last:
                raise StoreError(
                    f"the server at {self.endpoint_url or 'AWS S3'} listed "
                    f"{self._where(key)!r} after {self._where(last)!r}, not in S3's key order "
                    "(SeaweedFS lists in directory-tree order); open the store with the "
                    "option list_order = 'sorted'"
                )
            last = key
            yield key

    def _pages(self, prefix: str, after: Optional[str]) -> Iterator[str]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}
        if after:
            kwargs["StartAfter"] = self.prefix + after
        cut = len(self.prefix)
        while True:
            try:
                page = self._retrying(
                    "list", prefix, lambda: self._client.list_objects_v2(**kwargs)
                )
            except botocore.exceptions.ClientError as exc:
                raise self._fail("list", prefix, exc) from None
            for item in page.get("Contents", ()):
                key = item["Key"][cut:]
                if not key or key.endswith("/"):
                    continue  # "folder" markers made by consoles are not objects
                if not _valid_key(key):
                    continue  # written by another tool: no store key could name it
                yield key
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs["ContinuationToken"] = token
            kwargs.pop("StartAfter", None)

    def delete(self, key: str) -> None:
        full = self._key(key)
        try:
            self._retrying(
                "delete", key, lambda: self._client.delete_object(Bucket=self.bucket, Key=full)
            )
        except botocore.exceptions.ClientError as exc:
            _code, status = _error_code(exc)
            if status == 404 and _code != "NoSuchBucket":
                return
            raise self._fail("delete", key, exc) from None

    # -- checks ----------------------------------------------------------------------------

    def check_writable(self) -> str:
        """Write, read back, conditionally re-create and delete a probe object.

        :returns: a one-line summary; raises :class:`StoreError` on any failure.
        """
        key = f".yeto-preflight/{os.urandom(8).hex()}"
        data = os.urandom(32)
        self.put(key, data)
        try:
            if self.get(key) != data:
                raise StoreError(f"{self._where(key)}: the probe read back different bytes")
            if self.put_if_absent(key, b"second") is not False:
                raise StoreError(
                    f"{self._where(key)}: the server ignored If-None-Match (a second "
                    "create-if-absent succeeded); yeto's buffer needs conditional writes"
                )
            if self.get(key) != data:
                raise StoreError(f"{self._where(key)}: a refused conditional write changed it")
        finally:
            self.delete(key)
        return f"{self.url()} is reachable and writable; conditional writes honored"
