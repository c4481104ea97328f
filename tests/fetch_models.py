"""The tests' and benchmarks' way to the model cache: ``engine/model_pull.py``
(``llamaserve pull``), so they fetch exactly what users fetch."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.model_pull import (
    DEFAULT,
    MODELS,
    cache_dir,
    fetch,
    main,
    minilm_source_dir,
    model_path,
)

__all__ = ["DEFAULT", "MODELS", "cache_dir", "fetch", "main", "minilm_source_dir",
           "model_path"]

if __name__ == "__main__":
    sys.exit(main())
