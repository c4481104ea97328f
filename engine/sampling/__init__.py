"""Sampling: per-request sampler chains (``samplers``) and the pure rule for checking a
grammar on the best candidates only (``grammar_plan``)."""
