"""Downloads with pinned SHA-256, caching, retries, a deadline, and no partial files left behind.

Every remote dataset goes through :func:`fetch`. The file is streamed to a temporary name in the
destination folder (``.NAME.part-<pid>``) and renamed into place only after its size and checksum
match; a mismatch or a broken connection removes the temporary file and raises
:class:`DownloadError` naming the URL, the expected and the actual checksum.

- ``timeout`` is an overall deadline for the file (all attempts together, default
  :data:`DEFAULT_TIMEOUT`), so a server that trickles a byte a second cannot hold a job forever;
  a dataset sets it with ``data.params.<dataset>.timeout`` (seconds). ``read_timeout`` bounds a
  single stalled read.
- Only what retrying can fix is retried: timeouts, connection resets and truncated bodies, HTTP
  5xx (and 408/429). Any other HTTP error (a 404, a 403) fails at once, naming the URL and status.
- The bytes are streamed by pooch's ``HTTPDownloader`` (requests underneath) with its tqdm
  progress bar; truncated bodies are caught by urllib3's Content-Length check and retried.
- A partial file left by a download that was killed (``.NAME.part-<pid>`` whose process is no
  longer alive on this machine) is removed when the next download of that file starts.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import re
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..io import pid_alive as _pid_alive

DEFAULT_TIMEOUT = 600.0  # seconds for one file, all attempts together
DEFAULT_READ_TIMEOUT = 60.0  # seconds one read may stall
_RETRY_STATUS = {408, 429}  # plus every 5xx


class DownloadError(RuntimeError):
    pass


class _Deadline(TimeoutError):
    pass


def sha256_file(path: Path | str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()




def clean_stale_parts(dest: Path | str) -> list[Path]:
    """Remove ``.NAME.part-<pid>`` files next to ``dest`` whose process is gone; return them."""
    dest = Path(dest)
    pattern = re.compile(rf"^\.{re.escape(dest.name)}\.part-(\d+)$")
    removed = []
    try:
        candidates = list(dest.parent.iterdir())
    except OSError:
        return removed
    for p in candidates:
        m = pattern.match(p.name)
        if not m:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or _pid_alive(pid):
            continue
        try:
            p.unlink()
        except OSError:
            continue
        print(f"removed a stale partial download {p} (process {pid} is gone)", file=sys.stderr, flush=True)
        removed.append(p)
    return removed


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code in _RETRY_STATUS
    if isinstance(exc, (TimeoutError, ConnectionError, http.client.HTTPException)):
        return True
    if isinstance(exc, urllib.error.URLError):  # no answer at all: refused, reset, DNS hiccup
        return isinstance(exc.reason, OSError) and not isinstance(exc.reason, ssl.SSLCertVerificationError)
    return False


def fetch(url: str, dest: Path | str, sha256: str | None, retries: int = 3, timeout: float | None = None,
          backoff: float = 1.0, read_timeout: float = DEFAULT_READ_TIMEOUT) -> Path:
    """Download ``url`` to ``dest`` unless a file with the right checksum is already there.

    ``timeout`` is the deadline in seconds for the whole file (all ``retries`` attempts and the
    waits between them; None: :data:`DEFAULT_TIMEOUT`). ``sha256=None`` is allowed only for
    sources that publish no checksum; the computed one is printed so it can be pinned.
    """
    dest = Path(dest)
    if dest.exists() and sha256 and sha256_file(dest) == sha256:
        print(f"cached: {dest}", flush=True)
        return dest
    timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    dest.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_parts(dest)
    tmp = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    for attempt in range(1, retries + 1):
        try:
            _stream(url, tmp, deadline, timeout, read_timeout)
            actual = sha256_file(tmp)
            if sha256 and actual != sha256:
                raise DownloadError(f"checksum mismatch for {url}: expected sha256 {sha256}, got {actual}")
            if not sha256:
                print(f"WARNING: {url} has no pinned checksum; sha256={actual}", file=sys.stderr, flush=True)
            os.replace(tmp, dest)
            return dest
        except DownloadError:
            raise  # a wrong checksum will not fix itself: fail at once
        except _Deadline as exc:
            raise DownloadError(f"download of {url} exceeded its deadline of {timeout:g} s ({exc}; attempt "
                                f"{attempt}); raise data.params.<dataset>.timeout for a slow mirror") from exc
        except urllib.error.HTTPError as exc:
            if not _retryable(exc):
                raise DownloadError(f"could not download {url}: HTTP {exc.code} {exc.reason} "
                                    f"(not retried: retrying cannot fix a {exc.code})") from exc
            last = exc
        except Exception as exc:  # noqa: BLE001 - sorted into retryable or not below
            if not _retryable(exc):
                raise DownloadError(f"could not download {url}: {type(exc).__name__}: {exc}") from exc
            last = exc
        finally:
            tmp.unlink(missing_ok=True)
        left = deadline - time.monotonic()
        if attempt < retries:
            if left <= 0:
                break
            print(f"download of {url} failed ({last}); retry {attempt}/{retries - 1}", file=sys.stderr, flush=True)
            time.sleep(min(backoff * attempt, left))
            if deadline - time.monotonic() <= 0:
                break
    if deadline - time.monotonic() <= 0:
        raise DownloadError(f"download of {url} exceeded its deadline of {timeout:g} s (last error: {last}); "
                            f"raise data.params.<dataset>.timeout for a slow mirror")
    raise DownloadError(f"could not download {url} after {retries} attempts: {last}")


class _DeadlineFile:
    """The file pooch's downloader writes into: counts bytes and refuses to go past the deadline."""

    def __init__(self, fh, left):
        self.fh, self.left, self.n = fh, left, 0

    def write(self, block: bytes) -> int:
        self.left()
        self.n += len(block)
        return self.fh.write(block)

    def flush(self) -> None:
        self.fh.flush()


def _progress(url: str):
    """A byte progress bar for the download (tqdm, as pooch draws it): redrawn every second at a
    terminal, every 10 s in a job log so that a long download shows it is alive without flooding."""
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    # total=1, not 0: pooch tests the bar's truth value, and an empty tqdm is falsy; pooch sets the
    # real total from Content-Length
    return tqdm(total=1, unit="B", unit_scale=True, ncols=79, leave=True, file=sys.stderr, ascii=not tty,
                desc=url.rsplit("/", 1)[-1][:24], mininterval=1.0 if tty else 10.0)


def _stream(url: str, tmp: Path, deadline: float, timeout: float, read_timeout: float) -> None:
    """Stream ``url`` into ``tmp`` through pooch's HTTP downloader (requests, its progress bar).

    A read that trickles never trips a per-read timeout, so a watchdog closes the connection when
    the file's deadline passes; the blocked read then fails and the failure is reported as the
    deadline."""
    import pooch
    import requests

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Deadline(f"{out.n if out else 0} bytes after {timeout:g} s")
        return remaining

    out = None
    watchdog: list[threading.Timer] = []

    def arm(response, *args, **kwargs):
        sock = getattr(getattr(getattr(getattr(response.raw, "_fp", None), "fp", None), "raw", None), "_sock", None)
        if sock is not None:
            def cut():
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            timer = threading.Timer(max(deadline - time.monotonic(), 0.0), cut)
            timer.daemon = True
            timer.start()
            watchdog.append(timer)
        return response

    left()
    bar = _progress(url)
    downloader = pooch.HTTPDownloader(progressbar=bar, chunk_size=1 << 16,
                                      timeout=min(read_timeout, left()), hooks={"response": arm})
    try:
        with open(tmp, "wb") as fh:
            out = _DeadlineFile(fh, left)
            downloader(url, out, None)
    except requests.HTTPError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        raise urllib.error.HTTPError(url, status, exc.response.reason if exc.response is not None else "",
                                     None, None) from exc
    except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
        if deadline - time.monotonic() <= 0:
            raise _Deadline(f"{out.n if out else 0} bytes after {timeout:g} s") from exc
        raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        for timer in watchdog:
            timer.cancel()
        bar.close()
