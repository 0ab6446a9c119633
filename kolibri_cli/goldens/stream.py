"""Golden files as a stream: JSONL, gzip- or zstd-compressed JSONL, or a folder of such shards,
read line by line and never whole, and cut into pieces that workers read on their own.

A piece is the lines of one file that start in a byte range of its (decompressed) text. Plain
JSONL is cut into pieces of about `PIECE_BYTES`; a compressed file cannot be entered in the middle,
so it is one piece (split a large trace set into shards to spread it over workers).
Scope: finding golden files, planning pieces, reading them as `Golden` records (validated by
chains.py, errors name the file and line). Non-goals: simulation, writing goldens.
"""

import gzip
import io
import json
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import Golden, golden_from

PIECE_BYTES = 4 << 20  # ~1,500 chains of the shipped goldens: a few tenths of a second of work
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")  # what a folder is searched for


@dataclass(frozen=True)
class Piece:
    """The lines of golden file `path` that start at byte offsets in [start, stop) of its text
    (decompressed); stop None = to the end."""

    path: str
    start: int = 0
    stop: int | None = None

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.stop is None


def find_golden_files(paths: list[str | Path]) -> list[Path]:
    """Files as given; folders expand to every golden file under them (sorted): each file ending
    in one of SUFFIXES except prompt files (whose first object has no "output_ids"), so
    data/prompts/ is skipped."""
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.name.endswith(SUFFIXES))
            files.extend(p for p in found if p.is_file() and not _is_prompt_file(p))
        elif path.exists():
            files.append(_regular(path))
        else:
            raise KolibriError(f"goldens {path} not found: pass --goldens with a golden JSONL file "
                               "or a folder of them (kolibri goldens record writes them); without "
                               "--goldens the probe reads the goldens shipped with kolibri")
    return files


def _regular(path: Path) -> Path:
    """A golden file the probe can read in byte ranges: /dev/zero would never end, and a FIFO
    or socket cannot be read twice or in pieces."""
    mode = path.stat().st_mode
    if stat.S_ISREG(mode):
        return path
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
    raise KolibriError(f"{path}: is {kind}, expected a goldens file (a regular JSONL file, "
                       "compressed or not, or a folder of them)")


def plan_pieces(files: list[Path], piece_bytes: int = PIECE_BYTES,
                stops: dict[Path, int] | None = None) -> list[Piece]:
    """Every file cut into pieces in order; `stops` ends a file early (at that byte of its text).
    An empty file is a KolibriError naming it."""
    pieces = []
    for path in files:
        if first_line(path) is None:
            raise KolibriError(f"{path}: the file is empty")
        stop = (stops or {}).get(path)
        if stop == 0:
            continue  # a limit was reached before this file
        if is_compressed(path) or piece_bytes <= 0:
            pieces.append(Piece(str(path), 0, stop))
        else:
            pieces += _byte_ranges(path, piece_bytes, stop)
    return pieces


def read_piece(piece: Piece) -> Iterator[Golden]:
    """The piece's goldens, in file order; a bad line is a KolibriError naming file and line."""
    for line_no, line in _numbered_lines(piece):
        yield _golden(line, piece, line_no)


def iter_goldens(files: list[Path]) -> Iterator[Golden]:
    """Every golden of `files`, in order, one at a time."""
    for path in files:
        yield from read_piece(Piece(str(path)))


def limit_stops(files: list[Path], keep, limit: int) -> dict[Path, int]:
    """Where to stop reading so that exactly `limit` goldens pass `keep` (in file order): {file:
    byte offset just after the last one}, with files after it stopped at 0. Reads (and parses)
    only as far as needed."""
    stops, kept = {}, 0
    for path in files:
        if kept >= limit:
            stops[path] = 0
            continue
        piece = Piece(str(path))
        for line_no, line, end in _numbered_lines(piece, with_offsets=True):
            if keep(_golden(line, piece, line_no)):
                kept += 1
                if kept == limit:
                    stops[path] = end
                    break
    return stops


def first_line(path: Path) -> bytes | None:
    """The first non-blank line of the file's text, or None if there is none."""
    return next((line for _, line in _numbered_lines(Piece(str(path)))), None)


def is_compressed(path: Path) -> bool:
    return _magic(path) in (GZIP_MAGIC, ZSTD_MAGIC)


def piece_size(piece: Piece) -> int:
    """The piece's size in bytes on disk (compressed files: the whole file), for progress."""
    size = Path(piece.path).stat().st_size
    if is_compressed(Path(piece.path)):
        return size
    return (size if piece.stop is None else min(piece.stop, size)) - piece.start


def _is_prompt_file(path: Path) -> bool:
    try:
        obj = json.loads(first_line(path) or b"")
    except (ValueError, RecursionError):
        return False  # not a prompt file either: reading it as goldens will report the line
    return isinstance(obj, dict) and "output_ids" not in obj and "prompt_ids" not in obj


def _byte_ranges(path: Path, piece_bytes: int, stop: int | None) -> list[Piece]:
    """Pieces of about `piece_bytes`, each starting at the beginning of a line."""
    size = path.stat().st_size if stop is None else stop
    cuts = [0]
    with open(path, "rb") as f:
        while cuts[-1] + piece_bytes < size:
            f.seek(cuts[-1] + piece_bytes)
            f.readline()  # to the end of the line the cut fell in
            if f.tell() >= size:
                break
            cuts.append(f.tell())
    ends = cuts[1:] + [stop]
    return [Piece(str(path), a, b) for a, b in zip(cuts, ends, strict=True)]


def _numbered_lines(piece: Piece, with_offsets: bool = False):
    """(line number within the piece from 1, line) for each non-blank line that starts in the
    piece; with_offsets adds the text offset just after the line."""
    with _open(Path(piece.path)) as f:
        if piece.start:
            f.seek(piece.start)
        offset = piece.start
        for line_no, line in enumerate(f, start=1):
            if piece.stop is not None and offset >= piece.stop:
                return
            offset += len(line)
            if line.strip():
                yield (line_no, line, offset) if with_offsets else (line_no, line)


def _open(path: Path):
    """A binary reader of the file's text, decompressing gzip or zstd (by magic bytes)."""
    try:
        magic = _magic(path)
        if magic == GZIP_MAGIC:
            return gzip.open(path, "rb")
        if magic == ZSTD_MAGIC:
            return _open_zstd(path)
        return open(path, "rb")
    except FileNotFoundError:
        raise KolibriError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise KolibriError(f"{path}: is a folder, expected a file") from None
    except OSError as e:
        raise KolibriError(f"{path}: cannot read it ({e.strerror})") from None


def _open_zstd(path: Path):
    try:
        import zstandard
    except ImportError:
        raise KolibriError(f"{path} is zstd-compressed: pip install 'kolibri[zstd]' (or "
                           "pip install zstandard) to read it") from None
    reader = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    return io.BufferedReader(reader)


def _magic(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except FileNotFoundError:
        raise KolibriError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise KolibriError(f"{path}: is a folder, expected a file") from None
    return head if head == ZSTD_MAGIC else head[:2]


def _golden(line: bytes, piece: Piece, line_no: int) -> Golden:
    """The golden on this line; validation errors get the line's place only when raised (finding
    it costs a read of the file up to the piece)."""
    try:
        golden = golden_from(_object(line), _HERE)
    except KolibriError as e:
        raise KolibriError(str(e).replace(_HERE, _where(piece, line_no))) from None
    # Later checks (vocabulary, context) name the golden's place too: exact at a file's start,
    # else the piece's byte offset (counting the lines before it would cost a read).
    golden.where = (f"{piece.path}:{line_no}" if not piece.start
                    else f"{piece.path}:(byte {piece.start}, line {line_no} after it)")
    return golden


_HERE = "\x00here\x00"  # stands for "path:line" until an error names it


def _loads(line: bytes):
    """json.loads, by orjson when installed (4-5x faster: parsing is most of a replay's cost);
    what orjson refuses (NaN, huge integers, bad UTF-8) goes to json, which accepts or says why."""
    try:
        return _orjson_loads(line)
    except ValueError:
        return json.loads(line)


try:
    from orjson import loads as _orjson_loads
except ImportError:  # an install from before orjson was a dependency
    _orjson_loads = json.loads


def _object(line: bytes) -> dict:
    try:
        obj = _loads(line)
    except json.JSONDecodeError as e:
        raise KolibriError(f"{_HERE}: not JSONL (one JSON object a line): {e.msg}") from None
    except UnicodeDecodeError:
        raise KolibriError(f"{_HERE}: not UTF-8 text") from None
    if not isinstance(obj, dict):
        raise KolibriError(f"{_HERE}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _where(piece: Piece, line_no: int) -> str:
    """"path:line" — for a piece starting mid-file, its first line's number is counted (only
    when an error needs it)."""
    if piece.start:
        with _open(Path(piece.path)) as f:
            line_no += f.read(piece.start).count(b"\n")
    return f"{piece.path}:{line_no}"
