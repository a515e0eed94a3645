"""reprozoo.data.download.fetch against servers on 127.0.0.1: an overall deadline per file, no retry
of what retrying cannot fix (4xx), retry of what it can (5xx), stale partial files cleaned, and
checksums still enforced. Every server loop is bounded; no test needs more than a few seconds."""
from __future__ import annotations

import contextlib
import hashlib
import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from loopback import running  # noqa: E402
from reprozoo.data import download, registry  # noqa: E402
from reprozoo.data.download import DownloadError, fetch  # noqa: E402

BODY = b"reprozoo test payload\n" * 50
SHA = hashlib.sha256(BODY).hexdigest()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Per path: /ok (the body), /trickle (a byte every 0.2 s, at most 40), /404, /flaky (503 first,
    then the body), /corrupt (other bytes than pinned). Counts requests per path."""
    protocol_version = "HTTP/1.1"
    hits: dict[str, int]
    lock: threading.Lock

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def do_GET(self):  # noqa: N802
        path = self.path.split("?")[0]
        with self.lock:
            self.hits[path] = self.hits.get(path, 0) + 1
            n = self.hits[path]
        if path == "/ok":
            self._send(200, BODY)
        elif path == "/trickle":
            self.send_response(200)
            self.send_header("Content-Length", "40")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                for _ in range(40):  # bounded: 8 s at most, the client gives up after 1 s
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass
        elif path == "/flaky":
            if n == 1:
                self._send(503, b"busy")
            else:
                self._send(200, BODY)
        elif path == "/corrupt":
            self._send(200, BODY[:-1] + b"!")
        else:
            self._send(404, b"not found")


@contextlib.contextmanager
def serve() -> Iterator[tuple[str, dict]]:
    hits: dict[str, int] = {}
    handler = type("H", (_Handler,), {"hits": hits, "lock": threading.Lock()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    with running(server) as url:
        yield url, hits


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for k in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(k, raising=False)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_trickling_server_hits_the_deadline(tmp_path):
    with serve() as (url, hits):
        t0 = time.monotonic()
        with pytest.raises(DownloadError, match=r"deadline of 1 s") as exc:
            fetch(f"{url}/trickle", tmp_path / "x.bin", SHA, retries=3, timeout=1, backoff=0.1)
        took = time.monotonic() - t0
    assert took < 2.5, f"the deadline of 1 s took {took:.1f} s"
    assert f"{url}/trickle" in str(exc.value)
    assert hits["/trickle"] == 1  # the deadline covers the file, retries included
    assert _leftovers(tmp_path) == []


def test_404_is_requested_once_and_named(tmp_path):
    with serve() as (url, hits):
        t0 = time.monotonic()
        with pytest.raises(DownloadError, match="HTTP 404") as exc:
            fetch(f"{url}/missing.bin", tmp_path / "x.bin", SHA, retries=3, timeout=10, backoff=1.0)
        assert time.monotonic() - t0 < 1.0  # no backoff sleep either
    assert f"{url}/missing.bin" in str(exc.value)
    assert hits == {"/missing.bin": 1}
    assert _leftovers(tmp_path) == []


def test_503_then_200_succeeds_after_a_retry(tmp_path, capsys):
    with serve() as (url, hits):
        out = fetch(f"{url}/flaky", tmp_path / "x.bin", SHA, retries=3, timeout=10, backoff=0.05)
    assert out.read_bytes() == BODY and hits["/flaky"] == 2
    assert "retry 1/2" in capsys.readouterr().err
    assert _leftovers(tmp_path) == ["x.bin"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid  # reaped: no process has this pid (until the kernel reuses it)


def test_stale_partial_file_of_a_dead_process_is_removed(tmp_path, capsys):
    dead = _dead_pid()
    stale = tmp_path / f".x.bin.part-{dead}"
    stale.write_bytes(b"half a download")
    alive = tmp_path / f".x.bin.part-{os.getppid()}"  # a live process's download is left alone
    alive.write_bytes(b"in progress")
    other = tmp_path / f".y.bin.part-{dead}"  # another file's partial: not ours to judge here
    other.write_bytes(b"other")
    with serve() as (url, _):
        fetch(f"{url}/ok", tmp_path / "x.bin", SHA, timeout=10)
    assert not stale.exists() and alive.exists() and other.exists()
    assert (tmp_path / "x.bin").read_bytes() == BODY
    assert f"stale partial download {stale}" in capsys.readouterr().err


def test_corrupt_download_fails_its_checksum_and_leaves_nothing(tmp_path):
    with serve() as (url, hits):
        with pytest.raises(DownloadError, match=f"checksum mismatch for {url}/corrupt: expected sha256 {SHA}"):
            fetch(f"{url}/corrupt", tmp_path / "x.bin", SHA, retries=3, timeout=10, backoff=0.05)
    assert hits["/corrupt"] == 1 and _leftovers(tmp_path) == []


def test_default_deadline_and_timeout_is_an_accepted_dataset_param():
    assert download.DEFAULT_TIMEOUT == 600.0
    name = next(n for n in registry.names() if "remote" in registry.get(n).sources)
    spec = registry.get(name)
    scale = next(iter(spec.scales))
    assert spec.params(scale, {"timeout": 5})["timeout"] == 5
    with pytest.raises(registry.DatasetError, match="timeout"):  # the message lists it as allowed
        spec.params(scale, {"no_such_key": 1})


def test_download_goes_through_pooch_with_a_progress_bar(tmp_path, capsys, monkeypatch):
    import pooch

    calls = []
    real = pooch.HTTPDownloader.__call__
    monkeypatch.setattr(pooch.HTTPDownloader, "__call__",
                        lambda self, *a, **k: calls.append(self.progressbar) or real(self, *a, **k))
    with serve() as (url, hits):
        fetch(f"{url}/ok", tmp_path / "ok.bin", SHA)
    assert len(calls) == 1 and calls[0] is not None
    err = capsys.readouterr().err
    assert "ok: 100%" in err and "1.10k/1.10k" in err   # the bar filled to the Content-Length
    assert (tmp_path / "ok.bin").read_bytes() == BODY
