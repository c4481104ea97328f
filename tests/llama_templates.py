"""llama.cpp's own collection of real chat templates (``models/templates/``, about 70) and
its chat parse tests (``tests/test-chat.cpp``), from the llama-cpp-python sdist the
project builds on (PyPI: the same version as the installed bindings), unpacked once into
the model cache.

    python tests/llama_templates.py   # prints the directory
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.model_pull import cache_dir

WANTED = ("vendor/llama.cpp/models/templates/", "vendor/llama.cpp/tests/test-chat.cpp")


def _version() -> str:
    from importlib.metadata import version

    return version("llama_cpp_python")


def templates_dir() -> Path:
    """The directory holding the ``*.jinja`` templates and ``test-chat.cpp``."""
    target = cache_dir() / "llama.cpp-templates" / _version()
    done = target / ".ok"
    if done.exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", "--quiet", "-d", tmp, f"llama-cpp-python=={_version()}"],
                       check=True)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                rel = member.name.split("/", 1)[-1]
                if member.isfile() and rel.startswith(WANTED):
                    data = tar.extractfile(member)
                    assert data is not None
                    (target / Path(rel).name).write_bytes(data.read())
    done.write_text("ok\n")
    return target


def template(name: str) -> str:
    return (templates_dir() / name).read_text()


def all_templates() -> list[str]:
    return sorted(p.name for p in templates_dir().glob("*.jinja"))


if __name__ == "__main__":
    print(templates_dir())
