"""dspark.Model: generation with llama-cpp-python / OpenAI-shaped results."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Iterator, Sequence

from . import _core

_POLL_MS = 50  # how long one wait for new text blocks (Ctrl-C is seen between waits)


def _check_type(name, value, types, allow_none=False):
    if value is None and allow_none:
        return
    # bool is an int subclass; it is never a valid count or number here.
    if isinstance(value, bool) or not isinstance(value, types):
        want = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise TypeError(f"{name} must be {want}, got {type(value).__name__}")


def _stop_list(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise TypeError(f"stop must be a string or a list of strings, got {type(stop).__name__}")


class Model:
    """A target model (GGUF path or alias such as "smollm2") with its drafter.

    drafter: "auto" (the drafter shipped for the model, if any), a drafter
    directory, or None for plain decoding. threads: ATen threads (process
    wide). compute: "quant" (matmuls on the GGUF blocks) or "bf16". n_ctx: KV
    capacity per request (0: the model's context length). parallel: requests
    decoded together (calls from several threads share one batched engine).
    lookup_ngram: prompt-lookup drafts, the shortest n-gram matched (dspark
    --lookup-ngram; 0: off; None: 2 with a drafter, off without one).
    unread_timeout: seconds a request's text may wait unread before the
    request is cancelled and its slot freed: a stream iterator that is no
    longer consumed but still referenced (0: never). Reading it afterwards
    raises DsparkError.
    """

    def __init__(
        self,
        model_path: str,
        drafter: str | None = "auto",
        threads: int = 2,
        compute: str = "quant",
        n_ctx: int = 0,
        parallel: int = 4,
        verbose: bool = False,
        lookup_ngram: int | None = None,
        unread_timeout: float = 60.0,
    ):
        _check_type("model_path", model_path, str)
        _check_type("drafter", drafter, str, allow_none=True)
        _check_type("compute", compute, str)
        for name, value in (("threads", threads), ("n_ctx", n_ctx), ("parallel", parallel)):
            _check_type(name, value, int)
        _check_type("lookup_ngram", lookup_ngram, int, allow_none=True)
        _check_type("unread_timeout", unread_timeout, (int, float))
        if lookup_ngram is not None and lookup_ngram < 0:
            raise ValueError(f"lookup_ngram must be in [0, 64] or None, got {lookup_ngram}")
        self.model_path = model_path
        self._core = _core.Model(model_path, "none" if drafter is None else drafter, threads, compute, n_ctx, parallel,
                                 -1 if lookup_ngram is None else lookup_ngram, float(unread_timeout))
        self._info = self._core.info()
        stem = model_path.rsplit("/", 1)[-1]
        self.model_name = stem[:-5] if stem.endswith(".gguf") else stem
        self._lock = threading.Lock()

    # -- information ---------------------------------------------------------

    @property
    def drafter(self) -> str | None:
        """The drafter directory in use (None: plain decoding)."""
        return self._info["drafter"]

    def n_ctx(self) -> int:
        return self._info["n_ctx"]

    def n_vocab(self) -> int:
        return self._info["n_vocab"]

    def load(self) -> dict:
        """Engine occupancy: active, queued, parallel, steps, completed."""
        return self._core.load()

    def close(self) -> None:
        """Cancels running requests and stops the engine."""
        self._core.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- tokens ----------------------------------------------------------------

    def tokenize(self, text: str | bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        """Token ids of `text`; BOS first when add_bos and the model asks for it;
        special-token text is parsed when `special`."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="surrogateescape")
        _check_type("text", text, str)
        return self._core.tokenize(text, bool(add_bos), bool(special))

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        """The UTF-8 bytes of `tokens`."""
        tokens = list(tokens)
        for t in tokens:
            _check_type("token", t, int)
        return self._core.detokenize(tokens)

    # -- generation ------------------------------------------------------------

    def _options(self, max_tokens, temperature, top_k, top_p, min_p, seed, stop):
        _check_type("max_tokens", max_tokens, int)
        if not -(2**63) <= max_tokens < 2**63:  # the engine's range check takes a 64-bit integer
            raise ValueError(f"max_tokens must be a positive count below 2^63, got {max_tokens}")
        for name, value in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p)):
            _check_type(name, value, (int, float))
        _check_type("top_k", top_k, int)
        _check_type("seed", seed, int, allow_none=True)
        o = _core.RequestOptions()
        o.max_tokens = max_tokens
        o.temperature = float(temperature)
        o.top_k = top_k
        o.top_p = float(top_p)
        o.min_p = float(min_p)
        if seed is not None:
            o.seed = str(seed)  # range-checked by the engine, as the server checks it: -1 or [0, 2^64)
        o.stop = _stop_list(stop)
        return o

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self._core.encode_prompt(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise TypeError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def _chat_ids(self, messages) -> list[int]:
        if not isinstance(messages, (list, tuple)):
            raise TypeError(f"messages must be a list of {{role, content}} dicts, got {type(messages).__name__}")
        if not messages:
            raise ValueError("'messages' must contain at least one message")
        pairs = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise TypeError("each message must be a dict with string 'role' and 'content'")
            pairs.append((m["role"], m["content"]))
        return self._core.encode_chat(pairs)

    def _run(self, ids, opts, chat: bool, stream: bool):
        request = self._core.submit(ids, opts)
        meta = (("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], int(time.time()), self.model_name)
        if stream:
            return self._stream(request, chat, meta)
        return self._complete(request, chat, meta)

    @staticmethod
    def _wait(request) -> Iterator[str]:
        """Yields text as the engine produces it; cancels the request when the
        consumer stops early (close, KeyboardInterrupt, any exception)."""
        done = False
        try:
            while not done:
                done, text = request.poll(_POLL_MS)
                if text:
                    yield text.decode("utf-8", errors="replace")
        finally:
            if not done:
                request.cancel()

    @staticmethod
    def _check(request):
        if request.finish_reason == "error":
            raise _core.DsparkError(request.error)
        if request.finish_reason == "cancelled":
            raise _core.DsparkError(request.error or "the generation was cancelled")

    def _complete(self, request, chat, meta) -> dict:
        text = "".join(self._wait(request))
        self._check(request)
        return json.loads(request.response(chat, text, *meta))

    def _stream(self, request, chat, meta) -> Iterator[dict]:
        if chat:
            yield json.loads(_core.role_chunk(*meta))
        # On close() or an exception in the consumer, _wait's finally cancels the request.
        for text in self._wait(request):
            yield json.loads(_core.chunk(chat, text, *meta))
        self._check(request)
        yield json.loads(request.final_chunk(chat, *meta))

    def generate(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 256,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        stream: bool = False,
    ):
        """Completes `prompt` (text, tokenized as `dspark generate -p` does, or
        token ids). Returns an OpenAI "text_completion" dict (choices, usage,
        and "dspark": tau, acceptance_by_position, ...) or, with stream=True,
        an iterator of "text_completion" chunks (the last one carries
        finish_reason, usage and dspark). temperature 0: greedy."""
        opts = self._options(max_tokens, temperature, top_k, top_p, min_p, seed, stop)
        return self._run(self._prompt_ids(prompt), opts, chat=False, stream=stream)

    __call__ = generate
    create_completion = generate

    def create_chat_completion(
        self,
        messages: Sequence[dict],
        max_tokens: int = 256,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        stream: bool = False,
    ):
        """Chat completion over `messages` ([{role, content}]) with the model's
        chat template. Returns an OpenAI "chat.completion" dict, or with
        stream=True an iterator of "chat.completion.chunk" dicts."""
        opts = self._options(max_tokens, temperature, top_k, top_p, min_p, seed, stop)
        return self._run(self._chat_ids(messages), opts, chat=True, stream=stream)
