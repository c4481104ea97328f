"""Multimodal input: media spans in a prompt, the projector (llama.cpp's mtmd), and the
cache of encoded media."""
