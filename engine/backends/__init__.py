"""Where a model's layers run besides this machine's CPU: llama.cpp RPC servers."""
