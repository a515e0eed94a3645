"""PDEBench (Takamoto et al., NeurIPS 2022 Datasets & Benchmarks) files on DaRUS: catalogue and download.

URLs and MD5 checksums are those PDEBench publishes in ``pdebench/data_download/pdebench_data_urls.csv``
(github.com/pdebench/PDEBench, commit 535717d1a55c6b887ba3c256c3b935c989179ac5). DaRUS serves each file
at ``https://darus.uni-stuttgart.de/api/access/datafile/<id>``. PDEBench publishes MD5 only; no SHA-256
was found, so the SHA-256 of a downloaded file is printed and recorded in the card (pin it under
``sha256`` in datasets.yaml once seen). The base URL can be overridden with the dataset parameter
``base_url`` or the environment variable ``REPROZOO_PDEBENCH_BASE_URL`` (a mirror or a test server):
the file is then requested as ``<base_url><datafile id>``.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from ..download import DownloadError, fetch, sha256_file

DARUS = "https://darus.uni-stuttgart.de/api/access/datafile/"
ENV_BASE_URL = "REPROZOO_PDEBENCH_BASE_URL"
CATALOGUE_SOURCE = ("github.com/pdebench/PDEBench@535717d1a55c6b887ba3c256c3b935c989179ac5:"
                    "pdebench/data_download/pdebench_data_urls.csv")

# file name -> (DaRUS datafile id, MD5 published by PDEBench)
FILES: dict[str, tuple[str, str]] = {
    "1D_Burgers_Sols_Nu0.001.hdf5": ("268190", "44cb784d5a07aa2b1c864cabdcf625f9"),
    "1D_Burgers_Sols_Nu0.002.hdf5": ("268193", "edf1cd13622d151dfde3e4e5af7a95b4"),
    "1D_Burgers_Sols_Nu0.004.hdf5": ("268191", "435e1fecb8a64a0b4563bb8d09f81c33"),
    "1D_Burgers_Sols_Nu0.01.hdf5": ("281363", "e6d9a4f62baf9a29121a816b919e2770"),
    "1D_Burgers_Sols_Nu0.02.hdf5": ("268189", "7c8c717a3a7818145877baa57106b090"),
    "1D_Burgers_Sols_Nu0.04.hdf5": ("281362", "16f4c7afaf8c16238be157e54c9297c7"),
    "1D_Burgers_Sols_Nu0.1.hdf5": ("268185", "660ba1008d3843bf4e28d2895eb607ce"),
    "1D_Burgers_Sols_Nu0.2.hdf5": ("268187", "01d9333254dff2f3cad090b61f5cf695"),
    "1D_Burgers_Sols_Nu0.4.hdf5": ("268192", "58327a6107e8f9defb5075677cc42533"),
    "1D_Burgers_Sols_Nu1.0.hdf5": ("281365", "9021eba35332d127306f11ef84c1a60f"),
    "1D_Burgers_Sols_Nu2.0.hdf5": ("281364", "70fe0c24d9313e70f6059e5212bdb3d7"),
    "1D_Burgers_Sols_Nu4.0.hdf5": ("268188", "8af7f70166c00ffad377c80fa477d81f"),
    "ns_incom_inhom_2d_512-0.h5": ("133280", "54109d46f9c957317bd670ddb2068ac0"),
    "ns_incom_inhom_2d_512-1.h5": ("136439", "e280fd3208fccb8ad5c1ff46c4796864"),
}

# approximate sizes, for the log and the docs (PDEBench's README / DaRUS listing)
APPROX_GB = {"1D_Burgers": 8.2, "ns_incom": 9.9}


def md5_file(path: Path | str, chunk: int = 1 << 20) -> str:
    h = hashlib.md5()  # noqa: S324 - integrity check against a published MD5, not security
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def base_url(params: dict) -> str:
    url = params.get("base_url") or os.environ.get(ENV_BASE_URL) or DARUS
    return url if url.endswith("/") else url + "/"


def resolve(params: dict) -> dict:
    """File name, URL and checksums for the parameters (a ``checksums`` param overrides the pins)."""
    name = params["file"]
    if name not in FILES and not params.get("datafile_id"):
        raise KeyError(f"unknown PDEBench file '{name}'; known: {sorted(FILES)} (or give datafile_id and md5)")
    file_id, md5 = FILES.get(name, (None, None))
    file_id = str(params.get("datafile_id") or file_id)
    over = params.get("checksums") or {}
    return {"file": name, "url": base_url(params) + file_id, "datafile_id": file_id,
            "md5": over.get("md5", params.get("md5", md5)), "sha256": over.get("sha256", params.get("sha256"))}


def fetch_verified(url: str, dest: Path, md5: str | None, sha256: str | None, retries: int = 3,
                   backoff: float = 1.0, timeout: float | None = None) -> dict:
    """Download with :func:`fetch` (SHA-256 if pinned, retries, no partial file) and check the MD5.

    The file is downloaded under a hidden name and renamed to ``dest`` only after every pinned
    checksum matches; on a mismatch nothing is left behind and :class:`DownloadError` names the URL,
    the expected and the actual checksum.
    """
    dest = Path(dest)
    if dest.exists():
        if (not md5 or md5_file(dest) == md5) and (not sha256 or sha256_file(dest) == sha256):
            print(f"cached: {dest}", flush=True)
            return {"md5": md5_file(dest), "sha256": sha256_file(dest), "cached": True}
        dest.unlink()
    tmp = dest.with_name(f".{dest.name}.unverified")
    try:
        if not sha256 and md5:
            print(f"{url}: verifying against the published MD5 {md5} (no SHA-256 pinned)", flush=True)
        fetch(url, tmp, sha256, retries=retries, timeout=timeout, backoff=backoff)
        actual_md5 = md5_file(tmp)
        if md5 and actual_md5 != md5:
            raise DownloadError(f"checksum mismatch for {url}: expected md5 {md5}, got {actual_md5} "
                                f"(sha256 {sha256_file(tmp)}); the file was removed")
        actual_sha = sha256_file(tmp)
        os.replace(tmp, dest)
        return {"md5": actual_md5, "sha256": actual_sha, "cached": False}
    finally:
        tmp.unlink(missing_ok=True)


def acquire_remote(params: dict, raw_dir: Path) -> dict:
    r = resolve(params)
    print(f"PDEBench file {r['file']} from {r['url']} (full file; the PDEBench files are several GB)", flush=True)
    got = fetch_verified(r["url"], Path(raw_dir) / r["file"], r["md5"], r["sha256"],
                         retries=int(params.get("retries", 3)), backoff=float(params.get("backoff", 1.0)),
                         timeout=float(params.get("timeout", 3600.0)))  # deadline per file: several GB
    return {"url": r["url"], "version": f"DaRUS datafile {r['datafile_id']}", "pinned_md5": r["md5"],
            "pinned_sha256": r["sha256"], "downloaded_md5": got["md5"], "downloaded_sha256": got["sha256"],
            "catalogue": CATALOGUE_SOURCE, "origin": "PDEBench (DaRUS)"}


def nu_from_name(name: str) -> float | None:
    m = re.search(r"Nu([0-9.eE+-]+?)\.h(df)?5$", name)
    return float(m.group(1)) if m else None


def stride_for(raw: int, target: int | None, what: str) -> int:
    if not target or target >= raw:
        return 1
    if raw % target:
        raise ValueError(f"{what}: raw size {raw} is not a multiple of the requested {target}")
    return raw // target
