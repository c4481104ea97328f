"""Reranking prompts, built the way llama-server builds them (pure Python).

llama-server's ``format_prompt_rerank`` (tools/server/server-common.cpp) scores one
(query, document) pair per sequence, and a score equals llama-server's only if the tokens
do, so this mirrors it exactly:

- the GGUF has a ``tokenizer.chat_template.rerank`` template (LLM rerankers such as
  Qwen3-Reranker): ``{query}`` and then ``{document}`` are replaced in the text (in that
  order, each everywhere), and the whole text is tokenized without added specials but
  with special tokens parsed — so a document holding ``<|im_end|>`` reads as that token,
  as it does in llama-server;
- otherwise (cross-encoders such as bge-reranker): ``[BOS] query [EOS] [SEP] document
  [EOS]``, each marker only when the vocabulary asks for it (``add_bos``, ``add_eos``,
  ``add_sep``), EOS falling back to SEP when the vocabulary has none; query and document
  are tokenized without specials.

The score is the first value rank pooling yields for the sequence (llama.cpp: the
classification head's output; softmax over yes/no for qwen3, so P(yes)).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# (text, add_special, parse_special) -> token ids
Tokenize = Callable[[str, bool, bool], list[int]]


@dataclass(frozen=True)
class RerankFormat:
    template: str | None  # the GGUF's rerank template, with {query} and {document}
    bos: int | None  # added before the query (None: the vocabulary adds none)
    eos: int | None  # after the query and after the document
    sep: int | None  # between them

    def prompt(self, query: str, document: str, tokenize: Tokenize) -> list[int]:
        if self.template is not None:
            text = self.template.replace("{query}", query).replace("{document}", document)
            return tokenize(text, False, True)
        return self.join(tokenize(query, False, False), tokenize(document, False, False))

    def prompts(self, query: str, documents: list[str], tokenize: Tokenize) -> list[list[int]]:
        """One prompt per document (the query tokenized once when there is no template)."""
        if self.template is not None:
            return [self.prompt(query, d, tokenize) for d in documents]
        q = tokenize(query, False, False)
        return [self.join(q, tokenize(d, False, False)) for d in documents]

    def join(self, query: list[int], document: list[int]) -> list[int]:
        """The template-less layout around already tokenized texts."""
        out = [] if self.bos is None else [self.bos]
        out += query
        if self.eos is not None:
            out.append(self.eos)
        if self.sep is not None:
            out.append(self.sep)
        out += document
        if self.eos is not None:
            out.append(self.eos)
        return out


def vocab_format(template: str | None, *, bos: int, eos: int, sep: int, add_bos: bool,
                 add_eos: bool, add_sep: bool) -> RerankFormat:
    """The format from the vocabulary's special ids (-1: none) and flags."""
    eos_or_sep = eos if eos >= 0 else sep
    return RerankFormat(template=template,
                        bos=bos if add_bos and bos >= 0 else None,
                        eos=eos_or_sep if add_eos and eos_or_sep >= 0 else None,
                        sep=sep if add_sep and sep >= 0 else None)
