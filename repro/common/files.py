"""Files shared by every part of repro: the cache root, crash-safe writes, and inter-process locks."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` as :func:`atomic_write_bytes` does."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part (tmp + fsync +
    rename in the same directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cache_dir() -> Path:
    """Root of everything repro builds and caches outside git: ``$REPRO_CACHE_DIR`` or ``~/.cache/repro``."""
    override = os.environ.get("REPRO_CACHE_DIR")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "repro"


@contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """Exclusive lock on the file ``lock_path`` held for the block; serialises threads and processes alike
    (``flock`` locks belong to the open file, so each holder opens its own)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def file_lock(path: Path) -> AbstractContextManager[None]:
    """The lock guarding read-modify-write of ``path``: ``<path>.lock``."""
    return locked(path.with_name(path.name + ".lock"))


def checkpoint_config(model_dir: Path) -> dict:
    """A checkpoint's ``config.json`` as a dict; empty when it is missing or unreadable."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def weights_sha256(model_dir: Path) -> str:
    """sha256 over a checkpoint's weight files (``*.safetensors``, by name): the identity of the trained weights,
    which a config hash (what went in) does not give."""
    digest = hashlib.sha256()
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
