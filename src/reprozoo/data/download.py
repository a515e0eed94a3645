"""Downloads with pinned SHA-256, caching, retries, and no partial files left behind.

Every remote dataset goes through :func:`fetch`. The file is streamed to a temporary name in the
destination folder and renamed into place only after its size and checksum match; a mismatch or a
broken connection removes the temporary file and raises :class:`DownloadError` naming the URL,
the expected and the actual checksum.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


class DownloadError(RuntimeError):
    pass


def sha256_file(path: Path | str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def fetch(url: str, dest: Path | str, sha256: str | None, retries: int = 3, timeout: float = 60.0,
          backoff: float = 1.0) -> Path:
    """Download ``url`` to ``dest`` unless a file with the right checksum is already there.

    ``sha256=None`` is allowed only for sources that publish no checksum; the computed one is
    printed so it can be pinned.
    """
    dest = Path(dest)
    if dest.exists() and sha256 and sha256_file(dest) == sha256:
        print(f"cached: {dest}", flush=True)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    last: Exception | None = None
    for attempt in range(1, retries + 1):
        try:
            _stream(url, tmp, timeout)
            actual = sha256_file(tmp)
            if sha256 and actual != sha256:
                raise DownloadError(f"checksum mismatch for {url}: expected sha256 {sha256}, got {actual}")
            if not sha256:
                print(f"WARNING: {url} has no pinned checksum; sha256={actual}", file=sys.stderr, flush=True)
            os.replace(tmp, dest)
            return dest
        except DownloadError:
            tmp.unlink(missing_ok=True)
            raise  # a wrong checksum will not fix itself: fail at once
        except (urllib.error.URLError, OSError, TimeoutError, ConnectionError) as exc:
            tmp.unlink(missing_ok=True)
            last = exc
            if attempt < retries:
                print(f"download of {url} failed ({exc}); retry {attempt}/{retries - 1}", file=sys.stderr, flush=True)
                time.sleep(backoff * attempt)
        finally:
            tmp.unlink(missing_ok=True)
    raise DownloadError(f"could not download {url} after {retries} attempts: {last}")


def _stream(url: str, tmp: Path, timeout: float) -> None:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - URLs come from pinned catalogues
        expected = resp.headers.get("Content-Length")
        n = 0
        with open(tmp, "wb") as fh:
            while block := resp.read(1 << 20):
                fh.write(block)
                n += len(block)
        if expected is not None and n != int(expected):
            raise ConnectionError(f"truncated download: {n} of {expected} bytes")
