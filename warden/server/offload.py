"""Work that would hold the server's interpreter for seconds, done in a worker process.

A thread of the server's own does not keep the API responsive: pure-Python work (parsing a
20,000-queue policy, planning twice over every job) holds the interpreter's lock, and the event
loop that answers `/v1/health` waits for it at every turn; the collector then walks the
work's millions of objects with the lock held. In a worker process the server only waits for
the answer. The worker is started on first use (`spawn`: it inherits neither the server's
threads nor its descriptors, the API's socket among them), serves request after request, and
is replaced should it die. How many such requests run at once is bounded by the caller
(`warden.server.expensive_request_limits.ServerBudget`); `WORKERS` processes at most serve them.

What a worker refuses (`ApiError`) comes back as the same refusal."""

from __future__ import annotations

import copyreg
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from types import MappingProxyType
from typing import Any, TypeVar

from warden.server.errors import ApiError

__all__ = ["WORKERS", "in_worker"]

WORKERS = 2
"""Worker processes at most (started as the work needs them)."""

T = TypeVar("T")


def _mapping_proxy(m: MappingProxyType[Any, Any]) -> tuple[Any, tuple[dict[Any, Any]]]:
    return _read_only, (dict(m),)


def _read_only(d: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    return MappingProxyType(d)


# The engine's read-only mappings (a snapshot's) cross to the worker as what they are.
copyreg.pickle(MappingProxyType, _mapping_proxy)

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None


def in_worker(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` run in a worker process (`fn` and the arguments picklable): its result, or
    the `ApiError` it raised; a worker that died is a 503 for this request and replaced for
    the next."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=WORKERS, mp_context=multiprocessing.get_context("spawn"))
        pool = _pool
    try:
        outcome, value = pool.submit(_refusals_returned, fn, *args).result()
    except BrokenProcessPool:
        with _lock:
            if _pool is pool:
                _pool = None
        raise ApiError(
            503, "server", None, "the worker process doing this request ended; retry", headers={"Retry-After": "1"}
        ) from None
    if outcome == "refused":
        status, field, value_, message, headers = value
        raise ApiError(status, field, value_, message, headers)
    return value


def _refusals_returned(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """In the worker: `fn`'s result, or its refusal as plain values (an exception with its own
    constructor does not survive pickling)."""
    try:
        return "done", fn(*args)
    except ApiError as err:
        return "refused", (err.status, err.field, err.value, err.message, err.headers)
