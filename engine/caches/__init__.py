"""What the engine keeps between requests: the prefix cache (which sequence a request
runs in), its radix tree, the KV ledger, and sequence states on disk."""
