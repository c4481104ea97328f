"""Train a tiny Qwen3.5-architecture model with an MTP head, so ``draft-mtp`` drafts get
accepted, and convert it to GGUF with llama.cpp's own converter.

``tests/make_hybrid_model.py --mtp`` writes random weights: greedy text is the same with
and without drafts, but its MTP head never guesses right. This script trains one instead:
a Hugging Face ``Qwen3_5ForCausalLM`` (transformers 5.x; three Gated DeltaNet blocks and
one gated full-attention block, width 128) plus the MTP head Qwen3.5 checkpoints carry
under ``mtp.*`` (transformers has no module for it, so it is defined here in the shapes
the vendored ``convert_hf_to_gguf.py`` exports: ``mtp.fc`` over [normed embedding of
token t+1 | normed hidden state at t], ``mtp.pre_fc_norm_embedding``,
``mtp.pre_fc_norm_hidden``, one full-attention block ``mtp.layers.0.*`` and ``mtp.norm``
before the shared LM head), as llama.cpp's ``qwen35`` MTP graph runs it. Both learn on
the CPU for a few minutes from Python standard-library sources, tokenized with
Qwen2.5-Coder's real tokenizer (read from its GGUF, saved next to the checkpoint). The
head learns token t+2 from the trunk's final (normed) hidden state at t and token t+1,
and, chained on its own output as llama.cpp drafts, token t+3.

Training uses only the tokens the corpus contains (a compact vocabulary, so a step costs
milliseconds instead of a 151,936-way softmax); the saved embedding table has the full
vocabulary, with zero rows for tokens never seen (tied embeddings: their logit is 0).

It is a tiny model of code trained for minutes: it tests the MTP plumbing (the hidden
states, the head's KV, acceptance) end to end, not the quality of any real model.

Needs torch and transformers, which are not llamaserve dependencies (nor CI's): run it
with a separate venv's Python, which also needs the ``gguf`` package (transformers reads
the tokenizer from the GGUF with it; the vendored one is at ``$LLAMA_CPP_SRC/gguf-py``)::

    python -m venv /tmp/trainenv
    /tmp/trainenv/bin/pip install torch transformers safetensors numpy \
        /tmp/src/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py
    /tmp/trainenv/bin/python bench/make_mtp_model.py [--minutes 9] [--threads 2]

Training is time-boxed (``--minutes``), so how far it gets depends on the machine: on two
shared cores, 440 steps of 1,024 tokens in 9 minutes (then about a minute to convert).

Writes ``$LLAMASERVE_CACHE/test-models/qwen35-mtp-trained.gguf`` (and the Hugging Face
checkpoint in ``qwen35-mtp-trained-hf/`` beside it); never into git.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import AutoTokenizer, Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fetch_models import cache_dir, model_path  # noqa: E402

FILENAME = "qwen35-mtp-trained.gguf"
VENDOR = Path(os.environ.get("LLAMA_CPP_SRC",
                             "/tmp/src/llama_cpp_python-0.3.36/vendor/llama.cpp"))


def default_path() -> Path:
    return Path(cache_dir()) / "test-models" / FILENAME


def text_config(vocab_size: int, n_layer: int = 4) -> Qwen3_5TextConfig:
    """Width 128, blocks 0-2 linear attention and block 3 full attention (for the MTP
    block: one full-attention block of the same shape)."""
    cfg = Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_hidden_layers=n_layer,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention"] * (n_layer - 1) + ["full_attention"],
        max_position_embeddings=32768, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                         "mrope_interleaved": True},
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    return cfg


class MtpHead(nn.Module):
    """Qwen3.5's MTP block, named as checkpoints name it under ``mtp.``."""

    def __init__(self, cfg: Qwen3_5TextConfig) -> None:
        super().__init__()
        block_cfg = text_config(cfg.vocab_size, n_layer=1)
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(block_cfg, 0)])
        self.norm = Qwen3_5RMSNorm(h, eps=cfg.rms_norm_eps)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Normed output (what llama.cpp chains as the next draft's hidden row)."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds),
                               self.pre_fc_norm_hidden(hidden)], dim=-1))
        x = self.layers[0](x, position_embeddings=rope, attention_mask=None)
        out: torch.Tensor = self.norm(x)
        return out


def corpus(max_chars: int) -> str:
    """Standard-library sources, in a fixed order (tests and vendored packages left out)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts, size = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        size += len(text)
        if size >= max_chars:
            break
    return "\n\n".join(parts)


def batches(data: np.ndarray[Any, Any], seq: int, size: int, rng: np.random.Generator
            ) -> torch.Tensor:
    starts = rng.integers(0, len(data) - seq - 1, size)
    return torch.from_numpy(np.stack([data[s:s + seq] for s in starts]).astype(np.int64))


def losses(model: Qwen3_5ForCausalLM, mtp: MtpHead, ids: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cross-entropy of the trunk (t+1), the head (t+2) and the chained head (t+3)."""
    b, n = ids.shape
    pos = torch.arange(n).unsqueeze(0).expand(b, n)
    out = model.model(input_ids=ids, position_ids=pos)
    hidden = out.last_hidden_state  # after the final norm: llama.cpp's h_nextn
    embed = model.model.embed_tokens
    head = model.lm_head
    ce = nn.functional.cross_entropy
    vocab = head.weight.shape[0]
    main = ce(head(hidden[:, :-1]).reshape(-1, vocab), ids[:, 1:].reshape(-1))
    # the head at position p reads token p with the trunk's row of p - 1 (llama.cpp's pairing)
    rope = model.model.rotary_emb(hidden, pos[:, 1:])
    h1 = mtp(embed(ids[:, 1:]), hidden[:, :-1], rope)  # rows for positions 1..n-1
    first = ce(head(h1[:, :-1]).reshape(-1, vocab), ids[:, 2:].reshape(-1))
    rope2 = model.model.rotary_emb(hidden, pos[:, 2:])
    h2 = mtp(embed(ids[:, 2:]), h1[:, :-1], rope2)  # chained on its own rows
    second = ce(head(h2[:, :-1]).reshape(-1, vocab), ids[:, 3:].reshape(-1))
    return main, first, second


@torch.no_grad()
def evaluate(model: Qwen3_5ForCausalLM, mtp: MtpHead, ids: torch.Tensor) -> dict[str, float]:
    """Held-out accuracy; ``agree`` is what greedy drafting needs: the head's t+2 guess
    equals the trunk's own greedy token there (given the true t+1)."""
    model.eval()
    b, n = ids.shape
    pos = torch.arange(n).unsqueeze(0).expand(b, n)
    hidden = model.model(input_ids=ids, position_ids=pos).last_hidden_state
    logits = model.lm_head(hidden)
    rope = model.model.rotary_emb(hidden, pos[:, 1:])
    h1 = mtp(model.model.embed_tokens(ids[:, 1:]), hidden[:, :-1], rope)
    guess = model.lm_head(h1[:, :-1]).argmax(-1)
    greedy = logits.argmax(-1)
    model.train()
    return {"next acc": (greedy[:, :-1] == ids[:, 1:]).float().mean().item(),
            "mtp acc": (guess == ids[:, 2:]).float().mean().item(),
            "agree": (guess == greedy[:, 1:-1]).float().mean().item(),
            "max logit < 0": (logits.max(-1).values < 0).float().mean().item()}


def full_vocab(t: torch.Tensor, used: np.ndarray[Any, Any], n_vocab: int) -> torch.Tensor:
    out = torch.zeros(n_vocab, t.shape[1], dtype=t.dtype)
    out[torch.from_numpy(used.astype(np.int64))] = t
    return out


def save(model: Qwen3_5ForCausalLM, mtp: MtpHead, used: np.ndarray[Any, Any], n_vocab: int,
         hf_dir: Path) -> None:
    cfg = text_config(n_vocab)
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    cfg.eos_token_id = cfg.pad_token_id = 151643  # <|endoftext|>
    cfg.save_pretrained(hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1
    (hf_dir / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()
               if k != "lm_head.weight"}  # tied
    tensors["model.embed_tokens.weight"] = full_vocab(tensors["model.embed_tokens.weight"],
                                                      used, n_vocab)
    tensors.update({f"mtp.{k}": v.detach().contiguous() for k, v in mtp.state_dict().items()})
    save_file(tensors, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})


def convert(hf_dir: Path, out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(VENDOR / "gguf-py")}
    subprocess.run([sys.executable, str(VENDOR / "convert_hf_to_gguf.py"), str(hf_dir),
                    "--outfile", str(out), "--outtype", "f32"], check=True, env=env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path, default=default_path())
    ap.add_argument("--minutes", type=float, default=9.0, help="training wall time")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--chars", type=int, default=400_000, help="corpus size (characters)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    out: Path = args.out
    hf_dir = out.with_name(out.stem + "-hf")
    hf_dir.mkdir(parents=True, exist_ok=True)

    gguf_tok = model_path("qwen-0.5b")
    tok = AutoTokenizer.from_pretrained(str(gguf_tok.parent), gguf_file=gguf_tok.name)
    tok.save_pretrained(hf_dir)
    n_vocab = 151936  # Qwen2.5's embedding rows (the tokenizer has 151,665 entries)
    ids = np.asarray(tok(corpus(args.chars))["input_ids"], dtype=np.int64)
    used = np.unique(ids)
    compact = np.searchsorted(used, ids)
    split = int(len(compact) * 0.97)
    train, held = compact[:split], compact[split:]
    print(f"corpus: {len(ids):,} tokens, {len(used):,} distinct", file=sys.stderr)

    model = Qwen3_5ForCausalLM(text_config(len(used)))
    mtp = MtpHead(model.config)
    params = [*model.parameters(), *mtp.parameters()]
    print(f"parameters (compact vocabulary): {sum(p.numel() for p in params):,}",
          file=sys.stderr)
    peak = 5e-3
    opt = torch.optim.AdamW(params, lr=peak, weight_decay=0.01, betas=(0.9, 0.95))
    held_ids = batches(held, args.seq, 16, np.random.default_rng(1))
    budget = args.minutes * 60
    start, step = time.monotonic(), 0
    while (elapsed := time.monotonic() - start) < budget:
        frac = elapsed / budget
        lr = peak * min(1.0, (step + 1) / 10) * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
        for group in opt.param_groups:
            group["lr"] = lr
        main_loss, first, second = losses(model, mtp, batches(train, args.seq, args.batch, rng))
        loss = main_loss + 0.8 * first + 0.4 * second
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 20 == 0:
            print(f"step {step} {elapsed:.0f}s lr {lr:.2e} loss {main_loss.item():.3f} "
                  f"mtp {first.item():.3f} chained {second.item():.3f}", file=sys.stderr)
    print(f"held out: {evaluate(model, mtp, held_ids)}", file=sys.stderr)
    save(model, mtp, used, n_vocab, hf_dir)
    convert(hf_dir, out)
    print(out)


if __name__ == "__main__":
    main()
