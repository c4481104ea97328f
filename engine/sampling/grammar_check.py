"""llama.cpp parses each new grammar first in a child process, so that a grammar which
crashes its parser (a segfault or an abort in C++) costs that one request, not the server.

The child loads the model's vocabulary only (no weights) and answers one question: does
``llama_sampler_init_grammar`` (or its lazy variant) accept this grammar? The engine
thread builds the real sampler from the same text only after the child said yes. Answers
are cached by the grammar's digest, so an agent sending the same tools on every turn pays
the round trip once. A child that dies or takes longer than ``timeout`` is replaced, and
the request gets a ``GrammarError`` (a 400) that says so; the crash is logged with the
request that sent it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("llamaserve.grammar")

CACHE_SIZE = 512  # grammars remembered as accepted or refused
START_TIMEOUT = 120.0  # loading the vocabulary (seconds)
_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding engine/


class GrammarRefused(ValueError):
    """llama.cpp refused the grammar, or its parser crashed or hung on it."""


def child_main(model_path: str) -> int:
    """The child process: load the vocabulary, say ``null``, then answer each line
    ``{"text", "triggers"}`` with ``null`` (accepted) or a message, one JSON line each.
    llama.cpp's own log is silenced (it prints a refused grammar whole)."""
    import ctypes

    import llama_cpp as L

    def quiet(level: int, text: bytes, user_data: Any) -> None:
        pass

    callback = L.llama_log_callback(quiet)
    L.llama_log_set(callback, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    out = sys.stdout
    if not model:
        out.write(json.dumps("cannot load the vocabulary") + "\n")
        out.flush()
        return 1
    vocab = L.llama_model_get_vocab(model)
    out.write("null\n")
    out.flush()
    for line in sys.stdin:
        question = json.loads(line)
        text, triggers = question["text"].encode(), question["triggers"]
        if triggers:
            patterns = (ctypes.c_char_p * len(triggers))(*[t.encode() for t in triggers])
            sampler = L.llama_sampler_init_grammar_lazy_patterns(
                vocab, text, b"root", patterns, len(triggers), None, 0)
        else:
            sampler = L.llama_sampler_init_grammar(vocab, text, b"root")
        if sampler:
            L.llama_sampler_free(sampler)
        out.write("null\n" if sampler else '"llama.cpp could not parse the grammar"\n')
        out.flush()
    return 0


@dataclass
class CheckStats:
    checked: int = 0  # grammars sent to the child
    cached: int = 0  # answered from the cache
    crashed: int = 0  # children that died on a grammar
    timed_out: int = 0
    seconds: float = 0.0  # time spent waiting for the child


class GrammarChecker:
    """Asks a child process whether llama.cpp accepts a grammar. Thread-safe: calls are
    serialised (a parse takes milliseconds); the child starts on first use, or ahead of
    it with ``start``."""

    def __init__(self, model_path: str, timeout: float = 10.0) -> None:
        self.model_path = model_path
        self.timeout = timeout
        self.stats = CheckStats()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._answers: OrderedDict[bytes, str | None] = OrderedDict()

    def start(self) -> None:
        """Start the child in the background (the first check then finds it ready)."""
        threading.Thread(target=self._warm, name="llamaserve-grammar-start",
                         daemon=True).start()

    def _warm(self) -> None:
        with self._lock:
            try:
                self._ensure()
            except GrammarRefused as exc:
                log.warning("grammar checker: %s", exc)

    def check(self, text: str, triggers: tuple[str, ...] = ()) -> None:
        """Return if llama.cpp accepts ``text``; raise GrammarRefused (naming why) if it
        refuses it, crashes on it or takes longer than ``timeout``. A crash or a hang is
        logged with the grammar's digest, which the refusal's message repeats."""
        key = hashlib.blake2b("\0".join((text, *triggers)).encode("utf-8", "surrogatepass"),
                              digest_size=8).digest()
        with self._lock:
            if key in self._answers:
                self._answers.move_to_end(key)
                self.stats.cached += 1
                answer = self._answers[key]
            else:
                answer = self._ask(text, triggers, key.hex())
                self._answers[key] = answer
                while len(self._answers) > CACHE_SIZE:
                    self._answers.popitem(last=False)
        if answer is not None:
            raise GrammarRefused(answer)

    def _ensure(self) -> subprocess.Popen[str]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine.sampling.grammar_check", self.model_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, encoding="utf-8", env=env, cwd=_ROOT)
        self._proc = proc
        assert proc.stdout is not None
        failure = _read(proc.stdout, START_TIMEOUT)
        if failure is not None:
            self._stop()
            raise GrammarRefused(f"the grammar checker did not start: {failure}")
        return proc

    def _ask(self, text: str, triggers: tuple[str, ...], digest: str) -> str | None:
        proc = self._ensure()
        assert proc.stdin is not None and proc.stdout is not None
        started = time.perf_counter()
        self.stats.checked += 1
        try:
            proc.stdin.write(json.dumps({"text": text, "triggers": list(triggers)}) + "\n")
            proc.stdin.flush()
            return _read(proc.stdout, self.timeout)
        except TimeoutError:
            self.stats.timed_out += 1
            log.error("llama.cpp took over %g s to parse grammar %s (%d bytes); the "
                      "request got a 400 and the checker was restarted", self.timeout,
                      digest, len(text))
            self._stop()
            return (f"llama.cpp took longer than {self.timeout:g} s to parse the grammar "
                    f"for this schema (grammar {digest}): simplify the schema")
        except (EOFError, OSError, ValueError):
            code = proc.wait(5)
            self.stats.crashed += 1
            log.error("llama.cpp crashed (exit code %s) parsing grammar %s (%d bytes); the "
                      "request got a 400 and the checker was restarted", code, digest,
                      len(text))
            self._stop()
            return ("llama.cpp's grammar parser crashed on the grammar for this schema "
                    f"(grammar {digest}): simplify the schema")
        finally:
            self.stats.seconds += time.perf_counter() - started

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def close(self) -> None:
        with self._lock:
            self._stop()


def _read(stream: IO[str], timeout: float) -> str | None:
    """One JSON answer line; TimeoutError past ``timeout``, EOFError if the child died."""
    if not select.select([stream], [], [], timeout)[0]:
        raise TimeoutError
    line = stream.readline()
    if not line:
        raise EOFError
    answer = json.loads(line)
    return None if answer is None else str(answer)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1]))
