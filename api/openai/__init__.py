"""OpenAI's routes (completions, chat completions, embeddings) and the llama-server / vLLM
extensions beside them (tokenize / detokenize, infill)."""
