"""M-RoPE images: llamaserve against llama.cpp's own llama-server on the same files.

Held out of CI (llama-server is not built there). On the random-weight Qwen2-VL pair of
tests/make_vision_model.py (``qwen2vl`` text model + ``qwen2vl_merger`` projector: they
test plumbing, not vision), for several images (grids 4x2, 3x3, 8x4) and a question, both
servers answer greedily through the OpenAI SDK; then the same request again (the prefix
cache) and a follow-up turn after the answer (text after the image from the cache).
Compared, per case: the prompt token count, the cached tokens, the greedy text, and the
positions used: the image's position, read from each server's debug log (llama-server:
the slot's ``pos_max`` once the image is decoded, all its cells sit there; llamaserve:
the engine's "media at positions"), and the position after the prompt (llamaserve's
"next position", which llama-server does not log) against mtmd's own count
(``mtmd_helper_get_n_pos`` through the bindings, tests/mrope_reference.py). The greedy
text depends on every position (with positions equal to token indices every answer here
changes), so equal text is the end-to-end check.

Both servers get the same request and join its content parts alike (llama.cpp's rule: a
newline between text parts, none next to a media marker), so they render the same prompt.

    python bench/mrope.py --llama-server /tmp/llama-build/bin/llama-server

Prints a table and writes bench/results/mrope.json; exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from make_vision_model import write_vision_model  # noqa: E402
from mrope_reference import MARKER, greedy  # noqa: E402
from test_multimodal_server import data_url, png  # noqa: E402

from conftest import free_port, qwen_config, start_server  # noqa: E402

SYSTEM = "You look at pictures."
N = 16
CASES = {"4x2": png(1, 64, 32), "3x3": png(2, 48, 48), "8x4": png(3, 128, 64)}


def render(turns: list[tuple[str, str]]) -> str:
    out = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
    for role, content in turns:
        out += f"<|im_start|>{role}\n{content}<|im_end|>\n"
    return out + "<|im_start|>assistant\n"


def start_llama_server(binary: str, model: Path, mmproj: Path, threads: int,
                       log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [binary, "-m", str(model), "--mmproj", str(mmproj), "-c", "4096", "-np", "1",
         "-t", str(threads), "-tb", str(threads), "--port", str(port), "--jinja", "-v",
         "--no-webui"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("llama-server did not start")


def last_int(pattern: str, text: str) -> int | None:
    found = re.findall(pattern, text)
    return int(found[-1]) if found else None


def ask(client: OpenAI, messages: list[dict[str, Any]]) -> Any:
    return client.chat.completions.create(
        model="m", temperature=0, max_tokens=N,
        messages=[{"role": "system", "content": SYSTEM}, *messages])


def cached(r: Any) -> int:
    details = r.usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    model, mmproj = write_vision_model()
    tmp = Path(tempfile.mkdtemp(prefix="mrope-bench-"))
    ls_log = tmp / "llama-server.log"
    proc, ls_url = start_llama_server(args.llama_server, model, mmproj, args.threads, ls_log)
    cfg = qwen_config(n_seq_max=4, n_ctx=4096, threads=args.threads,
                      threads_batch=args.threads, mtmd={"mmproj_path": str(mmproj)})
    cfg["model"].update(path=str(model), alias="m")
    cfg["server"]["log_level"] = "debug"
    ours = start_server(cfg, tmp)
    rows: list[dict[str, Any]] = []
    ok = True
    try:
        clients = {"llamaserve": OpenAI(base_url=ours.base_url, api_key="x", max_retries=0),
                   "llama-server": OpenAI(base_url=f"{ls_url}/v1", api_key="x", max_retries=0)}

        def turn(server: str, img: bytes, follow: str | None, answer: str = "") -> Any:
            url = {"type": "image_url", "image_url": {"url": data_url(img)}}
            msgs: list[dict[str, Any]] = [{"role": "user", "content": [
                {"type": "text", "text": "Look:"}, url, {"type": "text", "text": "What is it?"}]}]
            if follow is not None:
                msgs += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": follow}]
            r = ask(clients[server], msgs)
            time.sleep(0.3)  # the log line is written
            log = ls_log.read_text(errors="replace") if server == "llama-server" \
                else ours.log()
            if server == "llama-server":
                pos = last_int(r"pos_max = (\d+)", log)
                nxt = None
            else:
                pos = last_int(r"media at positions \[(\d+)", log)
                nxt = last_int(r"next position (\d+)", log)
            return r, pos, nxt

        for name, img in CASES.items():
            prompt = render([("user", f"Look:{MARKER}What is it?")])
            ref = greedy(str(model), str(mmproj), prompt, [img], N, threads=args.threads)
            got: dict[str, dict[str, Any]] = {}
            next_positions = -1
            for server in clients:
                first, pos, nxt = turn(server, img, None)
                again, _, _ = turn(server, img, None)
                answer = first.choices[0].message.content
                follow, _, _ = turn(server, img, "And in one word?", answer)
                got[server] = {
                    "prompt_tokens": first.usage.prompt_tokens, "image_position": pos,
                    "text": answer, "again_cached": cached(again),
                    "follow_prompt_tokens": follow.usage.prompt_tokens,
                    "follow_cached": cached(follow),
                    "follow_text": follow.choices[0].message.content}
                if nxt is not None:
                    next_positions = nxt
            a, b = got["llamaserve"], got["llama-server"]
            same = {k: a[k] == b[k] for k in a}
            row = {"image": name, "mtmd_tokens": ref.n_tokens, "mtmd_positions": ref.n_pos,
                   "llamaserve_next_position": next_positions,
                   "reference_text": ref.text, **{f"{s}": got[s] for s in got},
                   "equal": same}
            rows.append(row)
            ok &= (all(same.values()) and a["text"] == ref.text
                   and a["prompt_tokens"] == ref.n_tokens and next_positions == ref.n_pos)
            print(f"image {name}: mtmd {ref.n_tokens} tokens / {ref.n_pos} positions; "
                  f"llamaserve's next position after the prompt {next_positions}")
            for k in a:
                mark = "==" if same[k] else "!="
                print(f"  {k:22} llamaserve {str(a[k])[:60]!r:64} {mark} llama-server "
                      f"{str(b[k])[:60]!r}")
            print(f"  reference text (mtmd_helper_eval_chunks): {ref.text[:60]!r}"
                  f" {'==' if a['text'] == ref.text else '!='} llamaserve")
    finally:
        ours.stop()
        proc.terminate()
        proc.wait(10)
    out = ROOT / "bench" / "results" / "mrope.json"
    out.write_text(json.dumps({"rows": rows, "all_equal": ok}, indent=1, ensure_ascii=False))
    print("ALL EQUAL" if ok else "DIFFERENCES FOUND", f"-> {out}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
