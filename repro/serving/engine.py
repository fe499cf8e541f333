"""Batched CPU generation for the CPU server.

A background thread collects pending requests (short window, bounded batch), left-pads them, prefills
once and decodes token by token with a KV cache. Each row samples with its own parameters and its own
``torch.Generator`` (so a seeded request is reproducible when run alone), and stops on an eos / stop
token, a stop string or ``max_tokens``. Events go to per-request asyncio queues through
``loop.call_soon_threadsafe``. Requests arriving while a batch runs wait for the next batch; so do
control calls (:meth:`Engine.between_batches`, e.g. a weight reload), which never run inside a batch.
Text conventions (as vLLM's): the token ids of a row include the eos / stop token that ended it, but
its text does not; a stop string ends the row and is cut from the text (the token ids still hold the
token that completed it). So ``decode(token_ids minus a trailing eos) == text`` unless the row ended
on a stop string, where the text is that decode cut at the stop string.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import logging
import queue
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from repro.common.lifecycle import Closing
from repro.serving.prefix_cache import PrefixCache, stacked_prefix
from repro.serving.sampling import TextTracker, sample_row

log = logging.getLogger(__name__)
T = TypeVar("T")


class PromptTooLongError(ValueError):
    """The prompt plus the requested completion does not fit the model's context."""


@dataclass
class EngineConfig:
    """Where the checkpoint is and how to batch and generate."""

    model_dir: Path
    max_batch_size: int = 8
    batch_window_s: float = 0.005
    torch_threads: int | None = 1  # 1 is fastest for tiny models on few cores; None: torch default
    default_max_tokens: int = 256
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    prefix_cache_tokens: int = 0  # > 0: keep finished rows' keys/values (this many tokens in all) for later calls



def end_token_ids(generation_eos: int | list[int] | None, tokenizer_eos: int | None) -> set[int]:
    """The ids that end a sampled turn: the generation config's end token(s) and the tokenizer's."""
    ids = set(generation_eos) if isinstance(generation_eos, list) else {generation_eos}
    return (ids | {tokenizer_eos}) - {None}

@dataclass
class SamplingParams:
    """Per-request sampling parameters (one row)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    top_logprobs: int = 0


@dataclass
class TokenEvent:
    """One sampled token: its id, raw logprob, optional top-k and the text it made visible."""

    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]] | None
    text: str


@dataclass
class FinishEvent:
    """The row ended; ``text`` is the last flushed text, ``stop_reason`` the stop string or token id."""

    reason: str  # "stop" | "length" | "abort"
    stop_reason: str | int | None
    text: str


@dataclass
class ErrorEvent:
    """Generation failed for this row."""

    message: str


Event = TokenEvent | FinishEvent | ErrorEvent


@dataclass
class EngineRequest:
    """One row to generate; events are put on ``out`` (tagged with ``tag``) in the request's loop."""

    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    out: asyncio.Queue[tuple[int, Event]]
    loop: asyncio.AbstractEventLoop
    tag: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event)

    def emit(self, event: Event) -> None:
        """Deliver an event to the request's asyncio queue (thread-safe)."""
        with contextlib.suppress(RuntimeError):  # loop closed: nobody is listening any more
            self.loop.call_soon_threadsafe(self.out.put_nowait, (self.tag, event))


@dataclass
class _Control:
    """A call the engine thread makes between batches; its result (or exception) goes to ``future``."""

    fn: Callable[[], Any]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.future.set_result(self.fn())
        except BaseException as exc:  # delivered to the caller
            self.future.set_exception(exc)


class BatchRow:
    """Decoding state of one request inside a batch."""

    def __init__(self, req: EngineRequest, tokenizer: Tokenizer, eos_ids: set[int]) -> None:
        self.req = req
        seed = req.params.seed if req.params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator().manual_seed(seed)
        self.tracker = TextTracker(tokenizer, req.params.stop)
        self.eos_ids = eos_ids
        self.stop_ids = eos_ids | set(req.params.stop_token_ids)
        self.generated: list[int] = []  # the sampled ids, in order

    def top_logprobs(self, logprobs: torch.Tensor) -> list[tuple[int, float]] | None:
        """The row's requested top-k (id, logprob) pairs of one position, or None when none were asked."""
        if self.req.params.top_logprobs <= 0:
            return None
        values, ids = torch.topk(logprobs, min(self.req.params.top_logprobs, logprobs.numel()))
        return list(zip(ids.tolist(), values.tolist(), strict=True))

    def step(self, token_id: int, logprob: float, top: list[tuple[int, float]] | None) -> bool:
        """Record a sampled token; emit its events; return True when the row is finished."""
        self.generated.append(token_id)
        if token_id in self.stop_ids:
            self.req.emit(TokenEvent(token_id, logprob, top, ""))
            stop_reason = None if token_id in self.eos_ids else token_id
            self.req.emit(FinishEvent("stop", stop_reason, self.tracker.flush()))
            return True
        text, stop = self.tracker.add(token_id)
        self.req.emit(TokenEvent(token_id, logprob, top, text))
        if stop is not None:
            self.req.emit(FinishEvent("stop", stop, ""))
            return True
        if len(self.generated) >= self.req.max_tokens:
            self.req.emit(FinishEvent("length", None, self.tracker.flush()))
            return True
        return False


class Engine(Closing):
    """Loads a checkpoint and serves batched generation to asyncio callers."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(config.model_dir)
        # The engine thread decodes with its own tokenizer object: fast tokenizers are not safe to share
        # between threads while one of them changes truncation/padding settings.
        tokenizer_json = (Path(config.model_dir) / "tokenizer.json").read_bytes()
        self._decoder = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        self.tokenizer_sha256 = hashlib.sha256(tokenizer_json).hexdigest()  # a weight reload must keep it
        self.model = AutoModelForCausalLM.from_pretrained(config.model_dir, dtype=torch.float32).eval()
        self.max_model_len = config.max_model_len or self.model.config.max_position_embeddings
        self.eos_ids = self._eos_ids()
        self._pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.loaded_dir = Path(config.model_dir)
        self._pending: queue.Queue[EngineRequest | _Control | None] = queue.Queue()
        self.prefix = PrefixCache(config.prefix_cache_tokens) if config.prefix_cache_tokens > 0 else None
        self._thread = threading.Thread(target=self._run, name="repro-engine", daemon=True)
        self._closed = False
        self._thread.start()

    def _eos_ids(self) -> set[int]:
        return end_token_ids(self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id)

    def resolve_max_tokens(self, prompt_len: int, max_tokens: int | None) -> int:
        """The row's token budget; raises :class:`PromptTooLongError` when it cannot fit."""
        room = self.max_model_len - prompt_len
        if room < 1:
            raise PromptTooLongError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                f"request has {prompt_len} input tokens. Please reduce the length of the input messages."
            )
        if max_tokens is None:
            return min(self.config.default_max_tokens, room)
        if max_tokens > room:
            raise PromptTooLongError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} "
                "in the completion). Please reduce the length of the messages or completion."
            )
        return max_tokens

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, out: asyncio.Queue[tuple[int, Event]], tag: int = 0
    ) -> EngineRequest:
        """Queue one row (call from the event loop); events arrive on ``out`` as ``(tag, event)``."""
        if self._closed:
            raise RuntimeError("engine is closed")
        if not prompt_ids:
            raise PromptTooLongError("The prompt is empty.")
        max_tokens = self.resolve_max_tokens(len(prompt_ids), params.max_tokens)
        req = EngineRequest(list(prompt_ids), params, max_tokens, out, asyncio.get_running_loop(), tag)
        self._pending.put(req)
        return req

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[Event]:
        """Generate one row; closing the iterator early cancels it."""
        out: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        req = self.submit(prompt_ids, params, out)
        try:
            while True:
                _, event = await out.get()
                yield event
                if not isinstance(event, TokenEvent):
                    return
        finally:
            req.cancelled.set()

    def between_batches(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn`` on the engine thread after the running batch (never during one); its result comes in the
        returned future (cancelled if the engine closes first)."""
        if self._closed:
            raise RuntimeError("engine is closed")
        control = _Control(fn)
        self._pending.put(control)
        return control.future

    def swap_model(self, model: PreTrainedModel, model_dir: Path) -> None:
        """Serve ``model`` from the next batch on (call on the engine thread, e.g. via :meth:`between_batches`).

        The generation config (eos ids, sampling defaults) stays the one the engine started with."""
        model.generation_config = self.model.generation_config
        self.model, self.loaded_dir = model.eval(), Path(model_dir)
        if self.prefix is not None:
            self.prefix.clear()  # the kept keys and values are the old weights'

    def close(self) -> None:
        """Stop the engine thread (pending requests are dropped, pending control calls cancelled)."""
        self._closed = True
        self._pending.put(None)
        self._thread.join(timeout=10)

    def _collect(self, first: EngineRequest) -> tuple[list[EngineRequest], _Control | None]:
        """The batch that starts with ``first``, and a control call that arrived while collecting it."""
        batch, control = [first], None
        deadline = time.monotonic() + self.config.batch_window_s
        while len(batch) < self.config.max_batch_size:
            try:
                item = self._pending.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is None:
                self._pending.put(None)
                break
            if isinstance(item, _Control):
                control = item
                break
            batch.append(item)
        return [r for r in batch if not r.cancelled.is_set()], control

    def _run(self) -> None:
        while (item := self._pending.get()) is not None:
            if isinstance(item, _Control):
                item.run()
                continue
            batch, control = self._collect(item)
            if batch:
                self._process(batch)
            if control is not None:
                control.run()
        self._drain()

    def _process(self, batch: list[EngineRequest]) -> None:
        try:
            with torch.inference_mode():
                self._generate_batch(batch)
        except Exception as exc:  # report to every caller, keep serving
            log.exception("generation failed")
            for req in batch:
                req.emit(ErrorEvent(f"generation failed: {type(exc).__name__}: {exc}"))

    def _drain(self) -> None:
        """At close: cancel the control calls still queued."""
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._pending.get_nowait()
                if isinstance(item, _Control):
                    item.future.cancel()

    def _prefill_inputs(self, batch: list[EngineRequest]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                     DynamicCache]:
        """``(input_ids, attention mask, position ids, cache)`` of a batch's prefill. Each row's kept prefix (see
        :mod:`repro.serving.prefix_cache`) goes into the cache right-aligned in ``cached`` columns and only the rest
        of its prompt is fed, right-aligned in ``span`` columns; unused columns are masked. Without kept prefixes
        this is the plain left-padded batch."""
        hits = [self.prefix.lookup(req.prompt_ids) if self.prefix is not None else (0, None) for req in batch]
        cached = max(n for n, _ in hits)
        rests = [req.prompt_ids[n:] for req, (n, _) in zip(batch, hits, strict=True)]
        span = max(len(rest) for rest in rests)
        input_ids = torch.full((len(batch), span), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), cached + span), dtype=torch.long)
        for i, ((n, _), rest) in enumerate(zip(hits, rests, strict=True)):
            mask[i, cached - n : cached] = 1
            mask[i, cached + span - len(rest) :] = 1
            input_ids[i, span - len(rest) :] = torch.tensor(rest)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, cached:]
        cache = DynamicCache(config=self.model.config)
        if cached:
            like = next(layers for n, layers in hits if n and layers is not None)
            for layer, (keys, values) in enumerate(stacked_prefix(hits, cached, like)):
                cache.update(keys, values, layer)
        return input_ids, mask, positions, cache

    def _keep_finished(self, rows: list[BatchRow], finished: list[int], cache: DynamicCache,
                       mask: torch.Tensor) -> None:
        """Keep the finished rows' keys and values (their prompt and the sampled tokens fed back) for later calls."""
        if self.prefix is None:
            return
        if any(layer.keys.shape[-2] != mask.shape[-1] for layer in cache.layers):
            return  # a sliding-window cache holds only the last window's positions: no whole prefix to keep
        for i in finished:
            columns = mask[i].bool()
            ids = (rows[i].req.prompt_ids + rows[i].generated)[: int(columns.sum())]
            self.prefix.store(ids, [(layer.keys[i][:, columns], layer.values[i][:, columns]) for layer in cache.layers])

    def _generate_batch(self, batch: list[EngineRequest]) -> None:
        rows = [BatchRow(req, self._decoder, self.eos_ids) for req in batch]
        input_ids, mask, positions, cache = self._prefill_inputs(batch)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1, :]
        positions = positions[:, -1:]
        while rows:
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            next_ids, keep = [], []
            for i, row in enumerate(rows):
                if row.req.cancelled.is_set():
                    row.req.emit(FinishEvent("abort", None, ""))
                    continue
                token_id = sample_row(logits[i], row.req.params, row.generator)
                if not row.step(token_id, float(logprobs[i, token_id]), row.top_logprobs(logprobs[i])):
                    keep.append(i)
                    next_ids.append(token_id)
            kept = set(keep)
            self._keep_finished(rows, [i for i in range(len(rows)) if i not in kept], cache, mask)
            if not keep:
                return
            if len(keep) < len(rows):
                index = torch.tensor(keep)
                cache.batch_select_indices(index)
                mask, positions = mask[index], positions[index]
                rows = [rows[i] for i in keep]
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], dim=-1)
            positions = positions + 1
            out = self.model(
                input_ids=torch.tensor(next_ids).unsqueeze(-1),
                attention_mask=mask,
                position_ids=positions,
                cache=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :]
