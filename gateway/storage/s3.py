"""The S3 binding: chunks as objects in a bucket, through boto3.

`S3Storage` implements `ChunkStorage` for AWS S3 and S3-compatible servers
(the embedded SeaweedFS among them). Keys given to its methods are relative;
the binding puts ``<prefix>/`` in front of them, and `S3Storage.list` takes
it off again.

What the binding does not do is retry: botocore's own retries are off and
every failure is raised at once, for `gateway.storage.retry.retrying` to judge
with `S3Storage.is_temp_failure` (S3QL's split: the backend classifies, one
policy retries). A missing object is `ChunkNotFound`; other final errors are
raised as botocore raised them, and the retry policy turns them into
`Tier2Error`.

S3 has no append. Concatenation is a multipart upload whose parts are copied
server side (UploadPartCopy) where they can be: every part but the last must
be at least 5 MiB on AWS (SeaweedFS enforces the same minimum, and refuses
the whole upload with EntityTooSmall at completion). Smaller sources are read
and uploaded, joined into parts of at least 5 MiB (`plan_concat`); when all
of it is re-uploaded and fits one part, one PUT does instead.
"""

from __future__ import annotations

import contextlib
import email.utils
import io
import ssl
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.config
import botocore.exceptions
import urllib3.exceptions
from botocore.exceptions import ClientError

from gateway import __version__
from gateway.buffers import Buffer
from gateway.errors import BindingUnsupported, ChunkNotFound, Tier2Error
from gateway.storage.interface import ObjectInfo

__all__ = [
    "MAX_PARTS",
    "MAX_PART_SIZE",
    "MIN_PART_SIZE",
    "ConcatPart",
    "S3Storage",
    "is_temp_failure",
    "plan_concat",
    "retry_after",
]

#: Smallest multipart part S3 accepts, except for the last part of an upload.
MIN_PART_SIZE = 5 * 1024 * 1024
#: Largest part (and largest UploadPartCopy range) S3 accepts.
MAX_PART_SIZE = 5 * 1024 * 1024 * 1024
#: Most parts one multipart upload may have.
MAX_PARTS = 10_000

#: S3 error codes that mean "try again later", whatever the HTTP status.
TEMPORARY_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
    }
)

#: Error codes of a missing object (a HEAD answer has no body, hence "404").
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def is_temp_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a boto3 call or while reading a body, may pass if retried.

    Temporary: connection failures and timeouts (connect and read), a
    connection closed or a body cut short, HTTP 5xx and 429, and the S3 error
    codes in `TEMPORARY_CODES`. Not temporary: everything else, a missing
    object and TLS certificate failures (which no retry mends) included.
    """
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return code in TEMPORARY_CODES or status == 429 or status >= 500
    if isinstance(exc, botocore.exceptions.SSLError):
        return not isinstance(exc.kwargs.get("error"), ssl.SSLCertVerificationError)
    return isinstance(
        exc,
        botocore.exceptions.ConnectionError  # connect refused/timeout, DNS, proxy
        | botocore.exceptions.HTTPClientError  # closed mid-way, read timeout, body cut
        | botocore.exceptions.IncompleteReadError  # body shorter than Content-Length
        | urllib3.exceptions.ProtocolError
        | urllib3.exceptions.TimeoutError
        | ConnectionError  # the builtin: reset, aborted, refused, broken pipe
        | TimeoutError,
    )


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (``Retry-After`` of a `ClientError`), if it did."""
    if not isinstance(exc, ClientError):
        return None
    headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # the other form: an HTTP date
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _is_not_found(exc: ClientError) -> bool:
    return _error_code(exc) in _NOT_FOUND_CODES


@dataclass(frozen=True)
class ConcatPart:
    """One part of a concatenation: a server-side copy, or bytes read and uploaded.

    ``pieces`` are ``(source index, start, end)`` byte ranges, in order. A
    copy has exactly one piece (UploadPartCopy with ``CopySourceRange``); an
    upload joins its pieces, each read with a ranged GET.
    """

    copy: bool
    pieces: tuple[tuple[int, int, int], ...]

    @property
    def size(self) -> int:
        """Bytes in this part."""
        return sum(end - start for _, start, end in self.pieces)


def plan_concat(
    sizes: Sequence[int], *, min_part: int = MIN_PART_SIZE, max_part: int = MAX_PART_SIZE
) -> list[ConcatPart]:
    """The parts of a multipart upload that concatenates sources of ``sizes``.

    Every part but the last is at least ``min_part`` (S3's rule). Sources of
    ``min_part`` or more are copied server side; smaller ones are collected
    into an upload part until it reaches ``min_part``. A big source right
    after such a collection lends its first bytes to fill that part up to
    ``min_part``, and the rest of it is still copied if that rest is big
    enough (or ends the whole). So only bytes of small sources, plus at most
    ``min_part`` per big source that follows small ones, are read and
    uploaded. Empty sources are skipped; none at all give no parts.
    """
    if any(size < 0 for size in sizes):
        raise ValueError(f"negative source size in {list(sizes)}")
    parts: list[ConcatPart] = []
    pending: list[tuple[int, int, int]] = []
    pending_size = 0
    last = max((i for i, size in enumerate(sizes) if size), default=-1)

    def flush() -> None:
        nonlocal pending, pending_size
        if pending:
            parts.append(ConcatPart(copy=False, pieces=tuple(pending)))
            pending, pending_size = [], 0

    for i, size in enumerate(sizes):
        start = 0
        if pending and size >= min_part:
            # Fill the collected part up from this source's head: cheaper
            # than reading the whole source, and the part must reach min_part.
            start = min_part - pending_size
            pending.append((i, 0, start))
            flush()
        rest = size - start
        if rest <= 0:
            continue
        if not pending and (rest >= min_part or i == last):
            # Copied server side, in ranges S3 accepts: equal pieces of at
            # most max_part, each over max_part / 2 >= min_part when split.
            count = -(-rest // max_part)
            step = -(-rest // count)
            for begin in range(start, size, step):
                parts.append(ConcatPart(copy=True, pieces=((i, begin, min(size, begin + step)),)))
            continue
        pending.append((i, start, size))
        pending_size += rest
        if pending_size >= min_part:
            flush()
    flush()
    return parts


class _MemoryviewReader(io.RawIOBase):
    """A seekable file over a memoryview, so boto3 can send it without a copy.

    boto3 accepts bytes, bytearray or a file as a body, not a memoryview;
    ``bytes(view)`` would copy every chunk once more (measured: about 5 ms of
    CPU per 8 MiB here), while `read` hands out slices of the view.
    """

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        size = len(self._view) if size is None or size < 0 else size
        end = min(len(self._view), self._pos + size)
        chunk = self._view[self._pos : end]
        self._pos = max(self._pos, end)
        # A memoryview, not bytes: http.client and hashlib take any buffer,
        # and not copying is the point of this class.
        return chunk  # type: ignore[return-value]

    def readinto(self, buffer: Any) -> int:
        chunk = self.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)

    def __len__(self) -> int:
        return len(self._view) - self._pos


def _body(data: Buffer) -> bytes | bytearray | _MemoryviewReader:
    if isinstance(data, memoryview):
        return _MemoryviewReader(data)
    return data


class S3Storage:
    """`ChunkStorage` on an S3 bucket (AWS or S3-compatible), thread-safe."""

    kind = "s3"
    supports_append = False
    supports_concat = True
    #: Keys per LIST request (S3's maximum, 1000); tests make it small to see pages.
    list_page_size = 1000

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str = "",
        region: str = "us-east-1",
        max_pool_connections: int = 8,
        timeout: float = 30.0,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        """A binding for ``bucket``, keys under ``prefix`` (no slashes needed at either end).

        ``endpoint_url`` selects an S3-compatible server ("" = AWS);
        ``timeout`` is the connect and the read timeout of one request;
        ``max_pool_connections`` should be at least the number of calls made
        at once (the layer's ``max_concurrency``). Credentials default to
        boto3's usual sources (environment, config files, instance roles).
        """
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.region = region
        config = botocore.config.Config(
            region_name=region,
            connect_timeout=timeout,
            read_timeout=timeout,
            max_pool_connections=max_pool_connections,
            # One attempt per call: `gateway.storage.retry` is the one retry
            # policy, and botocore retrying underneath it would multiply the
            # attempts and hide the failures from the statistics.
            retries={"total_max_attempts": 1, "mode": "standard"},
            tcp_keepalive=True,
            s3={
                # Bucket in the path: SeaweedFS and most S3-compatible
                # servers on an IP address cannot do virtual hosts.
                "addressing_style": "path",
                # No SHA-256 of every uploaded byte for the signature (botocore
                # does it over plain http, and over https without a checksum
                # header): TLS protects the bytes in transit, on loopback there
                # is nothing to protect them from, and each chunk's CRC32C is
                # in its metadata. Saves ~4 ms of CPU per 8 MiB.
                "payload_signing_enabled": False,
            },
            # No CRC32 of every body either (boto3 >= 1.36 adds one to each
            # upload by default, ~5 ms per 8 MiB): same reasoning.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            user_agent_extra=f"segment-gateway/{__version__}",
        )
        # A session of our own: boto3's default session is shared and not
        # thread-safe; a client is.
        session = boto3.session.Session(
            aws_access_key_id=access_key, aws_secret_access_key=secret_key, region_name=region
        )
        self._client: Any = session.client("s3", endpoint_url=endpoint_url or None, config=config)
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> S3Storage:
        """The binding for ``s3://bucket[/prefix]``; keyword arguments as for the constructor."""
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
            raise ValueError(f"expected s3://BUCKET[/PREFIX], got {url!r}")
        return cls(parts.netloc, parts.path.strip("/"), **kwargs)

    def __repr__(self) -> str:
        where = self.endpoint_url or "AWS"
        return f"S3Storage(s3://{self.bucket}/{self.prefix} at {where})"

    @property
    def client(self) -> Any:
        """The boto3 client underneath (for tests and tools)."""
        return self._client

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _relative(self, full_key: str) -> str:
        return full_key[len(self.prefix) + 1 :] if self.prefix else full_key

    # -- ChunkStorage ---------------------------------------------------------------

    def write(self, key: str, data: Buffer, metadata: Mapping[str, str]) -> None:
        """PUT the object with its user metadata (names and values must be ASCII).

        S3 keeps metadata names in lower case; `stat` returns them so.
        Non-ASCII metadata raises ValueError (S3 sends it as HTTP headers).
        """
        for name, value in metadata.items():
            if not (name.isascii() and value.isascii()):
                raise ValueError(f"S3 metadata must be ASCII: {name!r}: {value!r}")
        self._client.put_object(
            Bucket=self.bucket, Key=self._key(key), Body=_body(data), Metadata=dict(metadata)
        )

    def write_if_absent(self, key: str, data: Buffer, metadata: Mapping[str, str]) -> bool:
        """PUT with ``If-None-Match: *``: False, and nothing written, if ``key`` exists.

        Strongly consistent on AWS S3 and enforced by SeaweedFS: of several
        writers racing for one key, exactly one gets True.
        """
        try:
            self._client.put_object(
                Bucket=self.bucket,
                Key=self._key(key),
                Body=_body(data),
                Metadata=dict(metadata),
                IfNoneMatch="*",
            )
        except ClientError as e:
            if _error_code(e) == "PreconditionFailed":
                return False
            raise
        return True

    def read(self, key: str, offset: int, length: int) -> bytes:
        """A ranged GET of ``[offset, offset+length)``; shorter only at the object's end."""
        if offset < 0 or length < 0:
            raise ValueError(f"bad range: offset {offset}, length {length}")
        if length == 0:
            self.stat(key)  # a missing object is still ChunkNotFound
            return b""
        try:
            response = self._client.get_object(
                Bucket=self.bucket,
                Key=self._key(key),
                Range=f"bytes={offset}-{offset + length - 1}",
            )
        except ClientError as e:
            if _is_not_found(e):
                raise ChunkNotFound(key) from None
            # S3 answers a range that starts at or after the end (and any
            # range of an empty object) with 416 InvalidRange; pread at the
            # end of a file reads nothing, and so do we.
            if _error_code(e) == "InvalidRange":
                return b""
            raise
        body = response["Body"]
        try:
            # One read of the whole body. StreamingBody.read() reads straight
            # into the final bytes object (http.client asks the socket file
            # for exactly Content-Length bytes) and checks the length;
            # measured against readinto() into a preallocated bytearray (which
            # urllib3 implements as read + copy) on a 64 MiB object: ~880 vs
            # ~610 MB/s.
            data: bytes = body.read()
        finally:
            body.close()
        if response.get("ContentRange") is None and (offset or len(data) > length):
            # A server that ignored Range and sent the whole object.
            data = data[offset : offset + length]
        return data

    def delete(self, key: str) -> None:
        """DELETE the object; S3 answers 204 whether or not it existed."""
        self._client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose (relative) key starts with ``prefix``, in key order.

        The listing is collected, then sorted: S3 lists in byte order, but
        SeaweedFS walks its directories and puts ``a/b/c`` before ``a/b-1``.
        ``metadata`` is empty (S3 listings do not carry it).
        """
        paginator = self._client.get_paginator("list_objects_v2")
        found: list[ObjectInfo] = []
        pages = paginator.paginate(
            Bucket=self.bucket,
            Prefix=self._key(prefix),
            PaginationConfig={"PageSize": self.list_page_size},
        )
        for page in pages:
            for item in page.get("Contents", ()):
                found.append(
                    ObjectInfo(
                        key=self._relative(item["Key"]),
                        size=item["Size"],
                        mtime=item["LastModified"].timestamp(),
                    )
                )
        found.sort(key=lambda info: info.key)  # code point order = UTF-8 byte order
        return iter(found)

    def stat(self, key: str) -> ObjectInfo:
        """HEAD the object: size, mtime (whole seconds on S3) and user metadata."""
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as e:
            if _is_not_found(e):
                raise ChunkNotFound(key) from None
            raise
        return ObjectInfo(
            key=key,
            size=head["ContentLength"],
            mtime=head["LastModified"].timestamp(),
            metadata=dict(head.get("Metadata", {})),
        )

    def append(self, key: str, offset: int, data: Buffer, metadata: Mapping[str, str]) -> None:
        """S3 objects cannot grow: always `BindingUnsupported`."""
        raise BindingUnsupported("s3", "append")

    def concat(
        self,
        key: str,
        sources: Sequence[str],
        metadata: Mapping[str, str],
        *,
        sizes: Sequence[int] | None = None,
    ) -> None:
        """Create ``key`` as the concatenation of ``sources`` (which stay), of any sizes.

        A multipart upload as `plan_concat` lays it out: sources of 5 MiB or
        more are copied server side (UploadPartCopy), smaller ones are read
        and uploaded in parts of at least 5 MiB. If everything is re-uploaded
        and fits one part, it is one PUT instead. ``sizes`` (the sources'
        lengths, as the caller's metadata has them) saves a HEAD per source;
        a source shorter than its given size raises `Tier2Error`, and only
        the given number of bytes of each source is used.

        ``key`` may be one of the sources: every part is read or copied
        before the upload completes. On any failure the upload is aborted,
        so neither ``key`` nor stray parts remain; a missing source raises
        `ChunkNotFound` naming it. No sources make an empty object.
        """
        if sizes is None:
            sizes = [self.stat(source).size for source in sources]
        elif len(sizes) != len(sources):
            raise ValueError(f"{len(sources)} sources but {len(sizes)} sizes")
        plan = plan_concat(sizes)
        if len(plan) > MAX_PARTS:
            raise Tier2Error(f"concat into {key!r} needs {len(plan)} parts, S3 allows {MAX_PARTS}")
        if not plan or (len(plan) == 1 and not plan[0].copy):
            self.write(key, self._read_part(sources, plan[0]) if plan else b"", metadata)
            return
        target = self._key(key)
        upload = self._client.create_multipart_upload(
            Bucket=self.bucket, Key=target, Metadata=dict(metadata)
        )
        upload_id = upload["UploadId"]
        try:
            done = []
            for number, part in enumerate(plan, start=1):
                if part.copy:
                    done.append(self._copy_part(target, upload_id, number, sources, part))
                    continue
                answer = self._client.upload_part(
                    Bucket=self.bucket,
                    Key=target,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=self._read_part(sources, part),
                )
                done.append({"PartNumber": number, "ETag": answer["ETag"]})
            self._client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=target,
                UploadId=upload_id,
                MultipartUpload={"Parts": done},
            )
        except BaseException:
            # Parts of an unfinished upload are stored (and billed) until
            # aborted. If the abort fails too, the original error matters
            # more; a bucket lifecycle rule can reap what is left.
            with contextlib.suppress(Exception):
                self._client.abort_multipart_upload(
                    Bucket=self.bucket, Key=target, UploadId=upload_id
                )
            raise

    def _copy_part(
        self, target: str, upload_id: str, number: int, sources: Sequence[str], part: ConcatPart
    ) -> dict[str, Any]:
        """UploadPartCopy of the one range of ``part``, always with an explicit range.

        The range keeps the part exactly as planned: a source shorter than
        its size fails (InvalidRange) instead of shifting every later byte.
        """
        ((index, start, end),) = part.pieces
        try:
            copied = self._client.upload_part_copy(
                Bucket=self.bucket,
                Key=target,
                UploadId=upload_id,
                PartNumber=number,
                CopySource={"Bucket": self.bucket, "Key": self._key(sources[index])},
                CopySourceRange=f"bytes={start}-{end - 1}",
            )
        except ClientError as e:
            if _is_not_found(e):
                raise ChunkNotFound(sources[index]) from None
            if _error_code(e) == "InvalidRange":
                raise Tier2Error(
                    f"concat source {sources[index]!r} is shorter than {end} bytes"
                ) from None
            raise
        return {"PartNumber": number, "ETag": copied["CopyPartResult"]["ETag"]}

    def _read_part(self, sources: Sequence[str], part: ConcatPart) -> bytes:
        """The bytes of an upload part: its pieces read with ranged GETs and joined."""
        pieces = []
        for index, start, end in part.pieces:
            data = self.read(sources[index], start, end - start)
            if len(data) != end - start:
                raise Tier2Error(f"concat source {sources[index]!r} is shorter than {end} bytes")
            pieces.append(data)
        return b"".join(pieces)

    def is_temp_failure(self, exc: BaseException) -> bool:
        """See the module function `is_temp_failure`."""
        return is_temp_failure(exc)

    def retry_after(self, exc: BaseException) -> float | None:
        """See the module function `retry_after`."""
        return retry_after(exc)

    def close(self) -> None:
        """Close the connection pool; the binding is unusable afterwards."""
        if not self._closed:
            self._closed = True
            self._client.close()

    # -- administration -------------------------------------------------------------

    def create_bucket_if_missing(self) -> bool:
        """Create the bucket unless it exists; True if this call created it."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
            return False
        except ClientError as e:
            if _error_code(e) not in {"404", "NoSuchBucket", "NotFound"}:
                raise
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if self.region != "us-east-1":  # AWS refuses us-east-1 as a location constraint
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        try:
            self._client.create_bucket(**kwargs)
        except ClientError as e:
            if _error_code(e) in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                return False  # created meanwhile by someone else
            raise
        return True
