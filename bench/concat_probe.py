#!/usr/bin/env python3
"""Concat probe: what SeaweedFS's multipart copy accepts, and what merging chunks costs.

Groundwork for the storage optimizer of issue 33 (merging runs of small
chunks). Against the embedded SeaweedFS (`gateway.embedded.EmbeddedS3`, the
server the tests use), it asks:

1. **What is accepted.** UploadPartCopy of a whole object and with
   ``CopySourceRange``; parts below the 5 MiB minimum (1 MiB and 4 KiB,
   uploaded and copied) when they are not the last part, and where the
   refusal comes (at the part or at CompleteMultipartUpload); an empty
   source; and how conditional writes meet multipart: ``If-None-Match: *``
   and ``If-Match`` on CompleteMultipartUpload and PutObject, the ETag a
   concatenated object gets, ``CopySourceIfMatch`` on UploadPartCopy.
2. **What merging costs.** N source objects made into one (256 x 4 KiB,
   64 x 64 KiB, 16 x 1 MiB, 8 x 8 MiB, and 1 x 32 MiB followed by
   64 x 64 KiB) by: ``S3Storage.concat`` (serial, as the chunk layer calls
   it: HEADs, then `plan_concat`'s copies and re-uploads), the same with the
   sizes given (no HEADs); UploadPartCopy of every source, 8 at once; GET
   every source (serially, or 8 at once) and PUT the joined bytes once; GET
   8 at once and upload 8 MiB parts of a multipart upload. Baseline in the
   same run: one PUT of the same total bytes. Every result is checked
   byte-exact after the clock; methods the server refuses for a shape are
   reported with the error, not timed. Requests are counted per operation.

Prints one JSON document: medians and all times per shape and method, the
ratio to the baseline, and the requests each method makes.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import pathlib
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from botocore.exceptions import ClientError  # noqa: E402
from common import (  # noqa: E402
    argument_parser,
    log,
    print_result,
    result_header,
    stop_on_signals,
    work_directory,
)

from gateway.embedded import EmbeddedS3  # noqa: E402
from gateway.embedded.process import find_weed  # noqa: E402
from gateway.storage.s3 import MIN_PART_SIZE, S3Storage, plan_concat  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
THREADS = 8
#: Part size of the re-uploading multipart method.
UPLOAD_PART = 8 * MiB
BASELINE = "baseline: one PUT of the same bytes"
#: (label, [(count, size), ...]): the sources of one concat, in order.
SHAPES: list[tuple[str, list[tuple[int, int]]]] = [
    ("256 x 4 KiB", [(256, 4 * KiB)]),
    ("64 x 64 KiB", [(64, 64 * KiB)]),
    ("16 x 1 MiB", [(16, 1 * MiB)]),
    ("8 x 8 MiB", [(8, 8 * MiB)]),
    ("32 MiB + 64 x 64 KiB", [(1, 32 * MiB), (64, 64 * KiB)]),
]


def blob(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def error_of(exc: ClientError) -> dict[str, Any]:
    return {
        "code": exc.response.get("Error", {}).get("Code", ""),
        "status": exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0),
    }


class Probe:
    """One bucket on the embedded server and the raw client that the methods use."""

    def __init__(self, server: EmbeddedS3) -> None:
        self.storage = S3Storage(
            f"probe-{uuid.uuid4().hex[:12]}",
            endpoint_url=server.endpoint_url,
            access_key=server.access_key,
            secret_key=server.secret_key,
            max_pool_connections=2 * THREADS,
        )
        self.storage.create_bucket_if_missing()
        self.client: Any = self.storage.client
        self.bucket = self.storage.bucket
        self.pool = concurrent.futures.ThreadPoolExecutor(THREADS)
        #: S3 operations made, by name (botocore's before-call event; threads too).
        self.requests: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self.client.meta.events.register("before-call.s3", self._count)

    def _count(self, model: Any, **kwargs: Any) -> None:
        with self._lock:
            self.requests[model.name] += 1

    def close(self) -> None:
        self.pool.shutdown()
        self.client.delete_bucket(Bucket=self.bucket)
        self.storage.close()

    def get(self, key: str, byte_range: str | None = None) -> bytes:
        kwargs = {"Range": byte_range} if byte_range else {}
        body = self.client.get_object(Bucket=self.bucket, Key=key, **kwargs)["Body"]
        try:
            data: bytes = body.read()
        finally:
            body.close()
        return data

    def put(self, key: str, data: bytes, **kwargs: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.put_object(
            Bucket=self.bucket, Key=key, Body=data, **kwargs
        )
        return answer

    def multipart(
        self,
        key: str,
        parts: list[Callable[[str, int], dict[str, Any]]],
        *,
        parallel: bool = False,
        **complete: Any,
    ) -> dict[str, Any]:
        """A multipart upload whose part ``n`` is made by ``parts[n-1](upload_id, n)``."""
        upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            if parallel:
                futures = [self.pool.submit(make, upload_id, n) for n, make in enumerate(parts, 1)]
                done = [f.result() for f in futures]
            else:
                done = [make(upload_id, n) for n, make in enumerate(parts, 1)]
            answer: dict[str, Any] = self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": done},
                **complete,
            )
            return answer
        except BaseException:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise

    def copy_part(
        self, key: str, source: str, byte_range: str | None = None, **extra: Any
    ) -> Callable[[str, int], dict[str, Any]]:
        def make(upload_id: str, number: int) -> dict[str, Any]:
            kwargs = {"CopySourceRange": byte_range} if byte_range else {}
            answer = self.client.upload_part_copy(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                CopySource={"Bucket": self.bucket, "Key": source},
                **kwargs,
                **extra,
            )
            return {"PartNumber": number, "ETag": answer["CopyPartResult"]["ETag"]}

        return make

    def upload_part(self, key: str, data: bytes) -> Callable[[str, int], dict[str, Any]]:
        def make(upload_id: str, number: int) -> dict[str, Any]:
            answer = self.client.upload_part(
                Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
            )
            return {"PartNumber": number, "ETag": answer["ETag"]}

        return make

    # -- 1. what the server accepts ------------------------------------------------

    def attempt(self, key: str, expected: bytes | None, fn: Callable[[], Any]) -> dict[str, Any]:
        """Run ``fn``; accepted or the error; whether ``key`` then holds ``expected``."""
        try:
            fn()
        except ClientError as e:
            exists = self.exists(key)
            return {"accepted": False, **error_of(e), "target_exists_after": exists}
        result: dict[str, Any] = {"accepted": True}
        if expected is not None:
            result["bytes_correct"] = self.get(key) == expected
        return result

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError:
            return False
        return True

    def uploads_left(self) -> int:
        return len(self.client.list_multipart_uploads(Bucket=self.bucket).get("Uploads", []))

    def capabilities(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        small, mid, big = blob(1, 64 * KiB), blob(2, 3 * MiB), blob(3, 12 * MiB)
        one_a, one_b = blob(4, 1 * MiB), blob(5, 1 * MiB)
        tiny_a, tiny_b = blob(6, 4 * KiB), blob(7, 4 * KiB)
        five = blob(8, MIN_PART_SIZE)
        for key, data in [
            ("cap/small", small),
            ("cap/mid", mid),
            ("cap/big", big),
            ("cap/one_a", one_a),
            ("cap/one_b", one_b),
            ("cap/tiny_a", tiny_a),
            ("cap/tiny_b", tiny_b),
            ("cap/five", five),
            ("cap/empty", b""),
        ]:
            self.put(key, data)

        def mp(key: str, *parts: Callable[[str, int], dict[str, Any]], **kw: Any) -> None:
            self.multipart(key, list(parts), **kw)

        t = "cap/out/"
        found["upload_part_copy_whole_object"] = self.attempt(
            t + "whole", small, lambda: mp(t + "whole", self.copy_part(t + "whole", "cap/small"))
        )
        found["upload_part_copy_range_only_part"] = self.attempt(
            t + "range",
            mid[1000 : 1000 + MiB],
            lambda: mp(
                t + "range", self.copy_part(t + "range", "cap/mid", f"bytes=1000-{1000 + MiB - 1}")
            ),
        )
        found["upload_part_copy_ranges_6MiB_then_rest"] = self.attempt(
            t + "split",
            big,
            lambda: mp(
                t + "split",
                self.copy_part(t + "split", "cap/big", f"bytes=0-{6 * MiB - 1}"),
                self.copy_part(t + "split", "cap/big", f"bytes={6 * MiB}-{12 * MiB - 1}"),
            ),
        )
        for label, a, b, make in [
            ("uploaded_1MiB_parts", one_a, one_b, "upload"),
            ("copied_1MiB_parts", one_a, one_b, "copy"),
            ("uploaded_4KiB_parts", tiny_a, tiny_b, "upload"),
            ("copied_4KiB_parts", tiny_a, tiny_b, "copy"),
        ]:
            key = t + label
            src = {id(one_a): "cap/one_a", id(one_b): "cap/one_b"}
            src |= {id(tiny_a): "cap/tiny_a", id(tiny_b): "cap/tiny_b"}
            if make == "upload":
                parts = [self.upload_part(key, a), self.upload_part(key, b)]
            else:
                parts = [self.copy_part(key, src[id(a)]), self.copy_part(key, src[id(b)])]
            found[f"non_last_part_below_5MiB_{label}"] = self.attempt(
                key, a + b, partial(mp, key, *parts)
            )
        found["last_part_small_after_5MiB_copy"] = self.attempt(
            t + "last_small",
            five + tiny_a,
            lambda: mp(
                t + "last_small",
                self.copy_part(t + "last_small", "cap/five"),
                self.copy_part(t + "last_small", "cap/tiny_a"),
            ),
        )
        found["copy_empty_source_as_last_part"] = self.attempt(
            t + "empty_last",
            five,
            lambda: mp(
                t + "empty_last",
                self.copy_part(t + "empty_last", "cap/five"),
                self.copy_part(t + "empty_last", "cap/empty"),
            ),
        )
        found["binding_concat_64KiB_sources"] = self.attempt(
            t + "binding_small",
            small + small,
            lambda: self.storage.concat(t + "binding_small", ["cap/small", "cap/small"], {}),
        )
        found["uploads_left_after_refusals"] = self.uploads_left()
        found["conditional"] = self.conditionals(five, tiny_a)
        return found

    def conditionals(self, five: bytes, tiny: bytes) -> dict[str, Any]:
        """How If-None-Match / If-Match meet multipart uploads and copies."""
        c: dict[str, Any] = {}
        t = "cond/"

        def concat(key: str, **complete: Any) -> dict[str, Any]:
            return self.multipart(
                key,
                [self.copy_part(key, "cap/five"), self.copy_part(key, "cap/tiny_a")],
                **complete,
            )

        c["complete_if_none_match_absent"] = self.attempt(
            t + "a", five + tiny, lambda: concat(t + "a", IfNoneMatch="*")
        )
        c["complete_if_none_match_existing"] = self.attempt(
            t + "a", None, lambda: concat(t + "a", IfNoneMatch="*")
        )
        self.put(t + "p", b"plain")
        c["complete_if_none_match_over_plain_put"] = self.attempt(
            t + "p", None, lambda: concat(t + "p", IfNoneMatch="*")
        )
        c["plain_content_after_that"] = self.get(t + "p") == b"plain"
        c["put_if_none_match_over_concat_result"] = self.attempt(
            t + "a", None, lambda: self.put(t + "a", b"x", IfNoneMatch="*")
        )
        etag = self.client.head_object(Bucket=self.bucket, Key=t + "a")["ETag"]
        c["concat_result_etag"] = etag
        c["concat_result_etag_is_multipart_form"] = "-" in etag
        c["put_if_match_concat_etag"] = self.attempt(
            t + "a", b"replaced", lambda: self.put(t + "a", b"replaced", IfMatch=etag)
        )
        c["put_if_match_stale_etag"] = self.attempt(
            t + "a", None, lambda: self.put(t + "a", b"again", IfMatch=etag)
        )
        new_etag = self.client.head_object(Bucket=self.bucket, Key=t + "a")["ETag"]
        c["complete_if_match_current_etag"] = self.attempt(
            t + "a", five + tiny, lambda: concat(t + "a", IfMatch=new_etag)
        )
        c["complete_if_match_stale_etag"] = self.attempt(
            t + "a", None, lambda: concat(t + "a", IfMatch=new_etag)
        )
        # Two optimizers racing for one target name: both uploads are open at
        # once, both complete with If-None-Match: *.
        key = t + "race"
        ids = [
            self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
            for _ in range(2)
        ]
        parts = [
            [self.copy_part(key, "cap/five")(u, 1), self.copy_part(key, "cap/tiny_b")(u, 2)]
            for u in ids
        ]
        race = []
        for upload_id, done in zip(ids, parts, strict=True):
            try:
                self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": done},
                    IfNoneMatch="*",
                )
                race.append("won")
            except ClientError as e:
                race.append(error_of(e)["code"])
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        c["two_completes_if_none_match"] = race
        source_etag = self.client.head_object(Bucket=self.bucket, Key="cap/five")["ETag"]
        c["part_copy_source_if_match_current"] = self.attempt(
            t + "sim",
            five,
            lambda: self.multipart(
                t + "sim", [self.copy_part(t + "sim", "cap/five", CopySourceIfMatch=source_etag)]
            ),
        )
        c["part_copy_source_if_match_wrong"] = self.attempt(
            t + "sim2",
            None,
            lambda: self.multipart(
                t + "sim2", [self.copy_part(t + "sim2", "cap/five", CopySourceIfMatch='"0123"')]
            ),
        )
        c["uploads_left"] = self.uploads_left()
        return c

    # -- 2. what merging costs ----------------------------------------------------

    def sources_of(self, label: str, shape: list[tuple[int, int]]) -> tuple[list[str], bytes]:
        keys, datas, seed = [], [], 0
        for count, size in shape:
            for _ in range(count):
                seed += 1
                keys.append(f"src/{label}/{seed:04d}")
                datas.append(blob(seed, size))
        for key, data in zip(keys, datas, strict=True):
            self.put(key, data)
        return keys, b"".join(datas)

    def methods(self, keys: list[str], sizes: list[int]) -> dict[str, Callable[[str], Any]]:
        def binding_concat(target: str) -> None:
            self.storage.concat(target, keys, {})

        def binding_concat_sized(target: str) -> None:
            self.storage.concat(target, keys, {}, sizes=sizes)

        def copy_parallel(target: str) -> None:
            self.multipart(target, [self.copy_part(target, k) for k in keys], parallel=True)

        def get_put_serial(target: str) -> None:
            self.put(target, b"".join(self.get(k) for k in keys))

        def get_put_parallel(target: str) -> None:
            self.put(target, b"".join(self.pool.map(self.get, keys)))

        def get_multipart_parallel(target: str) -> None:
            data = b"".join(self.pool.map(self.get, keys))
            pieces = [data[i : i + UPLOAD_PART] for i in range(0, len(data), UPLOAD_PART)]
            self.multipart(target, [self.upload_part(target, p) for p in pieces], parallel=True)

        return {
            "S3Storage.concat": binding_concat,
            "S3Storage.concat, sizes given": binding_concat_sized,
            "UploadPartCopy, 8 at once": copy_parallel,
            "GET serial + one PUT": get_put_serial,
            "GET 8 at once + one PUT": get_put_parallel,
            "GET 8 at once + 8 MiB parts": get_multipart_parallel,
        }


def put_bytes(probe: Probe, data: bytes, target: str) -> None:
    """The baseline: one PUT of bytes already in memory."""
    probe.put(target, data)


def reuploaded_bytes(method: str, sizes: list[int]) -> int:
    """Bytes a method reads from the server and uploads again (each way)."""
    if method.startswith("S3Storage.concat"):
        return sum(part.size for part in plan_concat(sizes) if not part.copy)
    if method.startswith("UploadPartCopy"):
        return 0
    return sum(sizes)


def main() -> None:
    parser = argument_parser(__doc__, repeat=5, repeat_help="runs of every method (default 5)")
    args = parser.parse_args()
    stop_on_signals()
    result = result_header("concat_probe")
    with work_directory(args.dir, "concat-probe-") as work:
        server = EmbeddedS3(work / "s3")
        server.start()
        probe = None
        try:
            probe = Probe(server)
            result["seaweedfs"] = subprocess.run(
                [find_weed(), "version"], capture_output=True, text=True, check=False
            ).stdout.strip()
            log("capabilities")
            result["capabilities"] = probe.capabilities()
            shapes: dict[str, Any] = {}
            for label, shape in SHAPES:
                keys, expected = probe.sources_of(label.replace(" ", ""), shape)
                sizes = [size for count, size in shape for _ in range(count)]
                digest = hashlib.sha256(expected).hexdigest()
                methods = probe.methods(keys, sizes)
                methods[BASELINE] = partial(put_bytes, probe, expected)
                times: dict[str, list[float]] = {m: [] for m in methods}
                requests: dict[str, dict[str, int]] = {}
                errors: dict[str, Any] = {}
                names = list(methods)
                for run in range(args.repeat):
                    log(f"{label}: run {run + 1}/{args.repeat}")
                    # Rotate the order so no method always runs first (or last).
                    for name in names[run % len(names) :] + names[: run % len(names)]:
                        if name in errors:
                            continue
                        target = f"out/{uuid.uuid4().hex}"
                        before = collections.Counter(probe.requests)
                        started = time.perf_counter()
                        try:
                            methods[name](target)
                        except ClientError as e:
                            errors[name] = error_of(e)
                            continue
                        times[name].append(time.perf_counter() - started)
                        requests[name] = dict(sorted((probe.requests - before).items()))
                        if hashlib.sha256(probe.get(target)).hexdigest() != digest:
                            raise SystemExit(f"{label}, {name}: wrong bytes")
                        probe.client.delete_object(Bucket=probe.bucket, Key=target)
                base = statistics.median(times[BASELINE])
                shapes[label] = {"sources": len(keys), "bytes": len(expected), "methods": {}}
                for name, t in times.items():
                    if name in errors:
                        shapes[label]["methods"][name] = {"refused": errors[name]}
                        continue
                    shapes[label]["methods"][name] = {
                        "median_s": round(statistics.median(t), 4),
                        "times_s": [round(x, 4) for x in t],
                        "ratio_to_one_put": round(statistics.median(t) / base, 2),
                        "requests": sum(requests[name].values()),
                        "requests_by_operation": requests[name],
                        "bytes_read_and_reuploaded": (
                            0 if name == BASELINE else reuploaded_bytes(name, sizes)
                        ),
                    }
            result["shapes"] = shapes
            result["uploads_left"] = probe.uploads_left()
        finally:
            if probe is not None:
                probe.close()
            server.stop()
    print_result(result)


if __name__ == "__main__":
    main()
