"""Draft (speculative) decoding: prompt lookup, a draft model, MTP heads, and the
engine-side bookkeeping that sizes and verifies drafts."""
