"""Token masks from llguidance, for the constrained steps llama.cpp's grammar sampler would
otherwise decide by testing every candidate of the vocabulary (engine thread).

The runner asks llama.cpp's grammar about the best candidates first
(``engine.sampling.grammar_plan``); when none of them decides the step (a random or unsure
model ranks the few allowed tokens low, typically at a grammar's structural points), the
old way was llama.cpp's grammar over all 150k candidates: ~40 ms a step on Qwen2.5's
vocabulary. llguidance computes the same mask from a token trie in ~0.1 ms
(``bench/mask_engines.py``). llama.cpp's grammar stays the authority: the mask only narrows
the candidates the usual samplers choose from, and the chosen token is checked by
llama.cpp's grammar before it is taken (if the two ever disagree, the request goes back to
the full check for good).

A request's matcher is made at its first such step (most requests never need one), from
the request's GBNF in Lark form (``engine.constraints.gbnf_lark``), and catches up on the
tokens taken so far. It is a copy of a matcher kept at the grammar's start (``deep_copy``:
1-3 microseconds), compiled once per grammar in the background (one thread, started when the
prepare pool hands a grammar over once the tokenizer is built; the request does not wait
for it): compiling one took 2.5-5.5 ms (one tool; Claude Code's 24), on the engine thread,
at every request's first masked step, and every stream waited for it (agents send the same
tools every turn). llguidance releases the GIL while it compiles.

The tokenizer (every token by its text, control tokens included, as GBNF reads them) is
built once per model, in a background thread started by the model's first constrained
request (~1.4 s and 16 MiB for 150k tokens: llguidance's slicer, which
speeds up masks that allow most of the vocabulary, would take 45 MiB more and is left
out, since the best candidates decide those steps); the first step that needs it waits
for it, so a seeded request gives the same tokens however soon it comes. For grammars
llguidance cannot read, the full check runs as before.

Where the mask decides, a string the grammar forces is written in its canonical tokens
(llguidance's rule: "title", not "ti" + "tle"), where llama.cpp's grammar takes any split;
both are the same text.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt

from engine.constraints.gbnf_lark import gbnf_to_lark

L: Any = llama_cpp
log = logging.getLogger("llamaserve.engine")

MAX_SPECS = 64  # grammars kept converted (the same tools and schemas come back)
MAX_COMPILED = 16  # grammars kept compiled, as a matcher at their start
_FAILED = ""  # a grammar llguidance cannot read
_BIT = np.arange(32, dtype=np.intp)  # a mask word's bits, least significant first


def available() -> bool:
    try:
        import llguidance  # noqa: F401
    except ImportError:
        return False
    return True


class MaskEngine:
    """llguidance matchers over one model's vocabulary."""

    def __init__(self, vocab: Any, n_vocab: int, slices: list[str] | None = None) -> None:
        self.vocab = vocab
        self.n_vocab = n_vocab
        self.slices = [] if slices is None else slices  # llguidance's slicer: off (memory)
        self._tokenizer: Any = None
        self.pieces: list[bytes] | None = None  # each token's text, once built
        self._building: threading.Thread | None = None
        self._specs: OrderedDict[str, str] = OrderedDict()
        # a matcher at each grammar's start, copied for each request (None: llguidance
        # reported an error for it), compiled on ``_compiler`` (made at the first)
        self._compiled: OrderedDict[str, Future[Any]] = OrderedDict()
        self._compiler: ThreadPoolExecutor | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._mask = np.zeros((1, (n_vocab + 31) // 32), np.int32)
        self.enabled = available()

    def start(self) -> None:
        """Build the tokenizer in the background (once)."""
        if self.enabled and self._building is None:
            self._building = threading.Thread(target=self._build, name="mask-tokenizer",
                                              daemon=True)
            self._building.start()

    def tokenizer(self, timeout: float | None = None) -> Any | None:
        """The llguidance tokenizer, waiting for its build (None: llguidance unusable)."""
        self.start()
        if self._building is not None and self._tokenizer is None:
            self._building.join(timeout)
        return self._tokenizer

    def close(self) -> None:
        """Wait for a build under way (it reads the model's vocabulary, about to be freed)
        and for the compiles."""
        if self._building is not None:
            self._building.join()
        with self._lock:
            self._closed = True  # (a prepare thread still running compiles in place)
        if self._compiler is not None:
            self._compiler.shutdown(wait=True, cancel_futures=True)

    def _build(self) -> None:
        try:
            from llguidance import LLTokenizer

            # a small buffer first: slicing `.raw` copies the whole buffer (~150,000 tokens)
            piece = L.llama_cpp._lib.llama_token_to_piece  # (the wrapper's call costs 30%)
            small, large = ctypes.create_string_buffer(256), ctypes.create_string_buffer(
                16 * 1024)
            tokens = []
            for t in range(L.llama_vocab_n_tokens(self.vocab)):
                k = piece(self.vocab, t, small, len(small), 0, True)
                if k < 0:  # longer than the small buffer: -k bytes
                    k = piece(self.vocab, t, large, len(large), 0, True)
                    tokens.append(large.raw[:max(k, 0)])
                else:
                    tokens.append(small.raw[:k])
            tokens += [b""] * (self.n_vocab - len(tokens))
            fptr = ctypes.cast(L.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
            self._tokenizer = LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
                tokens=tokens, vocab_ptr=self.vocab, tokenize_fptr=fptr,
                eos_token=L.llama_vocab_eos(self.vocab), slices=self.slices)
            self.pieces = tokens
        except Exception as exc:
            log.warning("llguidance tokenizer not built (%s): constrained steps check "
                        "every candidate with llama.cpp's grammar", exc)
            self.enabled = False

    def prepare(self, grammar: str) -> None:
        """Convert ``grammar`` for llguidance before its request reaches the engine (on the
        prepare pool, beside llama.cpp's check): the conversion is pure Python, about 1 ms
        per 1,000 characters, and at the first masked step it would hold up every stream.
        Its compile starts too, once the tokenizer is built (neither is waited for)."""
        if self.enabled:
            spec = self._spec(grammar)
            if spec and self._tokenizer is not None:
                self._start_of(grammar, spec, self._tokenizer)

    def _spec(self, grammar: str) -> str:
        with self._lock:  # (the prepare pool's threads and the engine thread)
            spec = self._specs.get(grammar)
            if spec is not None:
                self._specs.move_to_end(grammar)
                return spec
        from llguidance import LLMatcher

        try:
            spec = LLMatcher.grammar_from_lark(gbnf_to_lark(grammar))
        except Exception:
            spec = _FAILED
        with self._lock:
            self._specs[grammar] = spec
            if len(self._specs) > MAX_SPECS:
                self._specs.popitem(last=False)
        return spec

    def matcher(self, grammar: str, taken: Sequence[int]) -> Any | None:
        """A matcher for ``grammar`` that has consumed ``taken``; None when llguidance
        cannot follow it (not ready, not readable, or it refuses a token llama.cpp took)."""
        tok = self.tokenizer()
        if tok is None:
            return None
        spec = self._spec(grammar)
        if not spec:
            return None
        kept = self._start_of(grammar, spec, tok)
        if kept.cancel():  # still queued behind other grammars: compiled here, now
            kept = self._done(grammar, _compile(tok, spec))
        start = kept.result()  # (compiled, or under way)
        if start is None:
            return None
        m = start.deep_copy()
        if taken and not m.consume_tokens(list(taken)):
            return None
        return m

    def _start_of(self, grammar: str, spec: str, tok: Any) -> Future[Any]:
        """The matcher kept at ``grammar``'s start (None: llguidance reports an error for
        it), its compile started if it is not kept (done in place once closed). Never
        advanced: requests get copies."""
        with self._lock:
            kept = self._compiled.get(grammar)
            if kept is not None and not kept.cancelled():
                self._compiled.move_to_end(grammar)
                return kept
            if not self._closed:
                if self._compiler is None:
                    self._compiler = ThreadPoolExecutor(1, thread_name_prefix="mask-compile")
                kept = self._compiled[grammar] = self._compiler.submit(_compile, tok, spec)
                self._evict()
                return kept
        return self._done(grammar, _compile(tok, spec))

    def _done(self, grammar: str, start: Any | None) -> Future[Any]:
        """``start`` kept as ``grammar``'s, compiled."""
        kept: Future[Any] = Future()
        kept.set_result(start)
        with self._lock:
            self._compiled[grammar] = kept
            self._evict()
        return kept

    def _evict(self) -> None:
        while len(self._compiled) > MAX_COMPILED:  # (a queued compile is dropped too)
            self._compiled.popitem(last=False)[1].cancel()

    def allowed(self, matcher: Any) -> npt.NDArray[np.intp]:
        """The ids the matcher allows next."""
        row = self._mask[0]
        matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        # only the words with a bit set are unpacked: where the mask decides a step, it
        # allows a few tokens (unpacking all 150k bits took twice the mask's own time)
        words = np.flatnonzero(row)
        bits = np.unpackbits(row[words].view(np.uint8), bitorder="little")
        ids = words.repeat(32) * 32 + np.tile(_BIT, len(words))
        ids = ids[bits.view(np.bool_)]
        return ids[ids < self.n_vocab] if len(ids) and ids[-1] >= self.n_vocab else ids


def _compile(tok: Any, spec: str) -> Any | None:
    """A matcher at the start of ``spec``'s grammar (None: llguidance reports an error, or
    fails)."""
    from llguidance import LLMatcher

    try:
        m = LLMatcher(tok, spec, log_level=0)
    except Exception as exc:  # (the request goes on with llama.cpp's grammar alone)
        log.warning("llguidance could not compile a grammar: %s", exc)
        return None
    return None if m.is_error() else m
