"""A small EDF+ writer (16-bit, continuous "EDF+C", with an annotation channel).

The simulators write their recordings in the formats of the public datasets (PhysioNet EEGMMIDB,
Sleep-EDF), so that offline, remote and user-path data go through one reader (``mne.io.read_raw_edf``).
``mne.export.export_raw(fmt="edf")`` needs the extra package ``edfio``; this writer needs nothing.

Format: a 256-byte header, 256 bytes per signal, then data records holding, for every signal in
turn, ``samples_per_record`` little-endian int16 values. Physical values map linearly from
[digital_min, digital_max] to [physical_min, physical_max]. The "EDF Annotations" signal carries
time-stamped annotation lists (TALs): each record starts with a time-keeping TAL ``+<t>\\x14\\x14\\x00``.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DIG_MIN, DIG_MAX = -32768, 32767


@dataclass
class Signal:
    label: str
    data: np.ndarray  # physical values, 1-D
    sfreq: float
    unit: str = "uV"
    physical_min: float | None = None
    physical_max: float | None = None
    transducer: str = ""
    prefilter: str = ""


def _field(value, width: int) -> bytes:
    text = value if isinstance(value, str) else _num(value, width)
    raw = text.encode("latin-1", "replace")
    if len(raw) > width:
        raise ValueError(f"EDF header field {text!r} longer than {width} characters")
    return raw.ljust(width, b" ")


def _num(x: float, width: int = 8) -> str:
    x = float(x)
    if x.is_integer() and len(str(int(x))) <= width:
        return str(int(x))
    for prec in range(width, 0, -1):
        s = f"{x:.{prec}g}"
        if len(s) <= width:
            return s
    raise ValueError(f"{x} does not fit in {width} characters")


def _tal(onset: float, duration: float | None, text: str) -> bytes:
    out = f"{onset:+.4f}".rstrip("0").rstrip(".").encode()
    if duration is not None and duration > 0:
        out += b"\x15" + f"{duration:.4f}".rstrip("0").rstrip(".").encode()
    return out + b"\x14" + text.encode("utf-8") + b"\x14\x00"


def write_edf(path: Path | str, signals: list[Signal], annotations: list[tuple[float, float, str]] = (),
              record_duration: float = 1.0, n_records: int | None = None, patient: str = "X X X X",
              recording: str | None = None, start: _dt.datetime | None = None) -> Path:
    """Write ``signals`` (physical units) and ``annotations`` [(onset_s, duration_s, text)] as EDF+C.

    ``signals`` may be empty (an annotation-only file, like a Sleep-EDF hypnogram); then
    ``n_records`` (and ``record_duration``) set the file's length.
    """
    path = Path(path)
    start = start or _dt.datetime(2000, 1, 1, 0, 0, 0)
    spr = []
    for s in signals:
        n = s.sfreq * record_duration
        if abs(n - round(n)) > 1e-9:
            raise ValueError(f"{s.label}: sfreq*record_duration must be an integer, got {n}")
        spr.append(int(round(n)))
    if signals:
        lengths = {len(s.data) / k for s, k in zip(signals, spr)}
        n_rec = int(np.ceil(max(lengths)))
    else:
        n_rec = int(n_records or 1)
    # annotations: one list per record (by onset), each record starts with its time-keeping TAL
    per_rec: list[list[bytes]] = [[_tal(r * record_duration, None, "")] for r in range(n_rec)]
    for onset, duration, text in sorted(annotations):
        r = min(int(onset // record_duration), n_rec - 1) if record_duration > 0 else 0
        per_rec[r].append(_tal(onset, duration, text))
    ann_bytes = max(sum(len(t) for t in tals) for tals in per_rec)
    ann_spr = int(np.ceil((ann_bytes + 2) / 2))

    labels = [s.label for s in signals] + ["EDF Annotations"]
    ns = len(labels)
    header = bytearray()
    header += _field("0", 8)
    header += _field(patient, 80)
    header += _field(recording or f"Startdate {start.strftime('%d-%b-%Y').upper()} X X X", 80)
    header += _field(start.strftime("%d.%m.%y"), 8)
    header += _field(start.strftime("%H.%M.%S"), 8)
    header += _field(256 * (ns + 1), 8)
    header += _field("EDF+C", 44)
    header += _field(n_rec, 8)
    header += _field(_num(record_duration), 8)
    header += _field(ns, 4)

    phys = []
    for s in signals:
        lo = float(np.min(s.data)) if s.physical_min is None else float(s.physical_min)
        hi = float(np.max(s.data)) if s.physical_max is None else float(s.physical_max)
        if hi <= lo:
            hi = lo + 1.0
        phys.append((float(_num(lo)), float(_num(hi))))
    phys.append((-1.0, 1.0))
    units = [s.unit for s in signals] + [""]
    transducers = [s.transducer for s in signals] + [""]
    prefilters = [s.prefilter for s in signals] + [""]
    all_spr = spr + [ann_spr]
    for group in (
        [_field(v, 16) for v in labels],
        [_field(v, 80) for v in transducers],
        [_field(v, 8) for v in units],
        [_field(_num(p[0]), 8) for p in phys],
        [_field(_num(p[1]), 8) for p in phys],
        [_field(DIG_MIN, 8)] * ns,
        [_field(DIG_MAX, 8)] * ns,
        [_field(v, 80) for v in prefilters],
        [_field(v, 8) for v in all_spr],
        [_field("", 32)] * ns,
    ):
        for b in group:
            header += b

    columns = []
    for s, k, (lo, hi) in zip(signals, spr, phys):
        x = np.zeros(n_rec * k)
        x[: len(s.data)] = s.data
        d = np.round((np.clip(x, lo, hi) - lo) / (hi - lo) * (DIG_MAX - DIG_MIN) + DIG_MIN)
        columns.append(d.astype("<i2").reshape(n_rec, k))
    ann = np.zeros((n_rec, ann_spr * 2), dtype=np.uint8)
    for r, tals in enumerate(per_rec):
        blob = b"".join(tals)
        ann[r, : len(blob)] = np.frombuffer(blob, dtype=np.uint8)
    columns.append(ann.view("<i2"))
    body = np.concatenate(columns, axis=1) if columns else np.zeros((n_rec, 0), "<i2")

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(bytes(header))
        fh.write(np.ascontiguousarray(body).tobytes())
    tmp.replace(path)
    return path
