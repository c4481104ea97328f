"""OpenAI's Files and Batch APIs: uploads, a SQLite store, and the worker running batch lines
through the interactive route handlers at background priority."""
