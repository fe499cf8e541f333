"""Group commit: calls from many concurrent requests share one SQLite transaction.

Each submitter gets told (through an asyncio future or a callback) only after the transaction holding
its call has committed, so an acknowledged call is durable; the commit cost is shared by the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable

from repro.store.codec import Previous, call_to_row, rebuild
from repro.store.drift import extends
from repro.store.records import CallRecord, encode_ids
from repro.store.schema import CALL_COLUMNS
from repro.store.sqlite_store import TraceStoreConfig, connect

_INSERT = f"INSERT INTO calls ({', '.join(CALL_COLUMNS)}) VALUES ({', '.join('?' * len(CALL_COLUMNS))})"
_UP_TO = ("SELECT rollout_id, seq, prompt_ids, completion_ids, request_json, prompt_prefix_len, messages_prefix_len, "
          "prefix_seq FROM calls WHERE rollout_id=? AND seq<=? ORDER BY seq")
_LAST_OF_PURPOSE = "SELECT max(seq) FROM calls WHERE rollout_id=? AND purpose=? AND seq<?"
Done = Callable[[BaseException | None], None]
_STOP = object()


class GroupCommitWriter:
    """A writer thread that batches call inserts into one transaction per drain of its queue."""

    def __init__(self, config: TraceStoreConfig, max_batch: int = 1024, cache_rollouts: int = 4096) -> None:
        self._config = config
        self._max_batch = max_batch
        self._cache_rollouts = cache_rollouts
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._last: OrderedDict[tuple[str, str], Previous] = OrderedDict()  # (rollout, purpose) -> last written
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.commits = 0
        self.written = 0
        self._thread = threading.Thread(target=self._run, name="trace-writer", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    # submitting -----------------------------------------------------------------------------------
    def submit(self, call: CallRecord, done: Done) -> None:
        """Queue ``call``; ``done(None)`` runs in the writer thread after commit (``done(exc)`` on failure)."""
        self._queue.put((call, done, None))

    async def write(self, call: CallRecord) -> None:
        """Queue ``call`` and wait until it is committed."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put((call, None, (loop, future)))
        await future

    def write_sync(self, call: CallRecord, timeout: float = 30.0) -> None:
        """Blocking variant for threads without an event loop."""
        finished = threading.Event()
        errors: list[BaseException] = []

        def done(exc: BaseException | None) -> None:
            if exc is not None:
                errors.append(exc)
            finished.set()

        self.submit(call, done)
        if not finished.wait(timeout):
            raise TimeoutError("trace writer did not commit in time")
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Flush what is queued and stop the thread."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    # the writer thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            conn = connect(self._config)
        except BaseException as exc:  # reported to the constructor
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        stopping = False
        while not stopping:
            batch = [self._queue.get()]
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if _STOP in batch:
                stopping = True
                batch = [item for item in batch if item is not _STOP]
            if batch:
                self._commit(conn, batch)
        conn.close()

    def _commit(self, conn: sqlite3.Connection, batch: list) -> None:
        rows = [self._row(conn, item[0]) for item in batch]
        errors: list[BaseException | None] = [None] * len(batch)
        try:
            conn.execute("BEGIN")
            conn.executemany(_INSERT, rows)
            conn.execute("COMMIT")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            errors = self._commit_one_by_one(conn, rows)
        self.commits += 1
        self.written += sum(1 for e in errors if e is None)
        self._notify(batch, errors)

    @staticmethod
    def _commit_one_by_one(conn: sqlite3.Connection, rows: list[tuple]) -> list[BaseException | None]:
        errors: list[BaseException | None] = []
        for row in rows:
            try:
                conn.execute(_INSERT, row)
                errors.append(None)
            except sqlite3.Error as exc:
                errors.append(exc)
        return errors

    def _row(self, conn: sqlite3.Connection, call: CallRecord) -> tuple:
        prompt = encode_ids(call.prompt_ids)
        completion = encode_ids(call.completion_ids)
        request = call.request
        messages = request.get("messages") if isinstance(request, dict) else None
        stored_prompt, prompt_prefix, stored_request, messages_prefix = prompt, 0, request, 0
        previous = self._previous(conn, call) if call.seq > 0 else None
        if previous is not None and prompt is not None and previous.prompt is not None:
            call.extends_previous = extends(previous.prompt, previous.completion, prompt)
            if call.extends_previous:
                cut = len(previous.prompt) + len(previous.completion)
                stored_prompt, prompt_prefix = prompt[cut:], cut // 4
        if previous is not None and _extends_messages(previous.messages, messages):
            messages_prefix = len(previous.messages)
            stored_request = {**request, "messages": messages[messages_prefix:]}
        self._remember((call.rollout_id, call.purpose), Previous(call.seq, prompt, completion or b"", messages))
        base_seq = previous.seq if prompt_prefix or messages_prefix else None
        return call_to_row(call, stored_request, stored_prompt, completion, prompt_prefix, messages_prefix, base_seq)

    def _previous(self, conn: sqlite3.Connection, call: CallRecord) -> Previous | None:
        """The rollout's latest written call before ``call`` with the same purpose (None when there is none)."""
        cached = self._last.get((call.rollout_id, call.purpose))
        if cached is not None and cached.seq < call.seq:
            return cached
        seq = conn.execute(_LAST_OF_PURPOSE, (call.rollout_id, call.purpose, call.seq)).fetchone()[0]
        if seq is None:
            return None
        rows = conn.execute(_UP_TO, (call.rollout_id, seq)).fetchall()
        prompt, request = rebuild(rows)[-1]
        messages = request.get("messages") if isinstance(request, dict) else None
        return Previous(seq, prompt, rows[-1]["completion_ids"] or b"", messages)

    def _remember(self, key: tuple[str, str], previous: Previous) -> None:
        cached = self._last.get(key)
        if cached is not None and cached.seq > previous.seq:
            return
        self._last[key] = previous
        self._last.move_to_end(key)
        while len(self._last) > self._cache_rollouts:
            self._last.popitem(last=False)

    @staticmethod
    def _notify(batch: list, errors: list[BaseException | None]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for (_, done, waiter), error in zip(batch, errors, strict=True):
            if done is not None:
                done(error)
            else:
                loop, future = waiter
                by_loop.setdefault(loop, []).append((future, error))
        for loop, futures in by_loop.items():
            with contextlib.suppress(RuntimeError):  # loop already closed: nobody is waiting
                loop.call_soon_threadsafe(_resolve, futures)


def _resolve(futures: list) -> None:
    for future, error in futures:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


def _extends_messages(previous: list | None, messages: list | None) -> bool:
    """True when ``messages`` starts with all of ``previous`` (a non-empty list)."""
    if not previous or not isinstance(messages, list) or len(messages) < len(previous):
        return False
    return messages[: len(previous)] == previous
