"""Golden files as a stream: JSONL, gzip- or zstd-compressed JSONL, or a folder of such shards,
read line by line and never whole, and cut into pieces that workers read on their own.

A piece is the lines of one file that start in a byte range of its (decompressed) text. Plain
JSONL is cut into pieces of about `PIECE_BYTES`; a compressed file cannot be entered in the middle,
so it is one piece (split a large trace set into shards to spread it over workers).
A file is outside input: a line is at most KOLIBRI_MAX_LINE_MB long (64: a 9M-token chain), a
compressed file's text at most KOLIBRI_MAX_EXPANSION times the file (200, and 64 MB whatever
the file), and corrupt compression, nesting too deep and 4,300-digit numbers are each one error
line. Text is read in blocks, so a run of blank lines costs no Python per line.
Scope: finding golden files, planning pieces, reading them as `Golden` records (validated by
chains.py, errors name the file and line). Non-goals: simulation, writing goldens.
"""

import gzip
import io
import json
import os
import re
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import Golden, golden_from
from kolibri_cli.text import shown

PIECE_BYTES = 4 << 20  # ~1,500 chains of the shipped goldens: a few tenths of a second of work
BLOCK_BYTES = 1 << 20  # text read at a time
MAX_LINE_VAR, MAX_LINE_MB = "KOLIBRI_MAX_LINE_MB", 64  # a 1M-token chain's line is ~7 MB
EXPANSION_VAR, MAX_EXPANSION = "KOLIBRI_MAX_EXPANSION", 200  # JSONL of ids: gzip ~4x, zstd ~6x
MIN_TEXT_BYTES = 64 << 20  # a compressed file may always expand this far
_BLANKS = re.compile(rb"[ \t\r\n\f\v]*")
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
    data/prompts/ is skipped, and empty files (`empty_golden_files` names them)."""
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(p for p in _candidates(path)
                         if first_line(p) is not None and not _is_prompt_file(p))
        elif path.exists():
            files.append(_regular(path))
        else:
            raise KolibriError(f"goldens {path} not found: pass --goldens with a golden JSONL file "
                               "or a folder of them (kolibri goldens record writes them); without "
                               "--goldens the probe reads the goldens shipped with kolibri")
    return files


def empty_golden_files(paths: list[str | Path]) -> list[Path]:
    """The empty files the folders among `paths` hold, which find_golden_files skips (a server
    stopped before its first request left one, in older versions)."""
    return [p for path in map(Path, paths) if path.is_dir() for p in _candidates(path)
            if first_line(p) is None]


def _candidates(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.name.endswith(SUFFIXES) and p.is_file())


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
    """The piece's goldens, in file order; a bad line is a KolibriError naming file and line. A
    file holds one model's chains (the probe prices a file by its first golden's model): a golden
    of another model is a KolibriError too."""
    model = None if not piece.start else _model(_golden(first_line(Path(piece.path)),
                                                          Piece(piece.path), 1))
    for line_no, line in _numbered_lines(piece):
        golden = _golden(line, piece, line_no)
        model = model or _model(golden)
        if _model(golden) != model:
            raise KolibriError(
                f"{golden.where}: a golden of {shown(golden.model)} in a file of "
                f"{shown(model[0])}'s goldens (the first line's model prices the file); keep "
                "each model's goldens in a file of their own")
        yield golden


def _model(golden: Golden) -> tuple[str, str]:
    return golden.model, golden.model_sha256


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
    path = Path(piece.path)
    max_line = _limit(MAX_LINE_VAR, MAX_LINE_MB) << 20
    with _open(path) as f:
        if piece.start:
            f.seek(piece.start)
        blocks = _blocks(f, path, _max_text(path))
        for line_no, line, end in _lines(blocks, piece.start, piece.stop, max_line, path):
            yield (line_no, line, end) if with_offsets else (line_no, line)


def text_lines(f, path: Path):
    """(line number from 1, line) for each non-blank line of the open binary file `f`, read in
    blocks: at most KOLIBRI_MAX_LINE_MB a line, whatever the file's size."""
    max_line = _limit(MAX_LINE_VAR, MAX_LINE_MB) << 20
    for line_no, line, _ in _lines(_blocks(f, path, None), 0, None, max_line, path):
        yield line_no, line


def _lines(blocks, offset: int, stop: int | None, max_line: int, path: Path):
    """(line number from 1, line, text offset after it) for each non-blank line of the text in
    `blocks` (starting at text `offset`) that starts before `stop`."""
    line_no, pending, held = 0, [], 0  # pending: the parts of a line not ended yet
    for block in blocks:
        i = 0
        while i < len(block):
            if not pending:  # skip whole blank lines at C speed
                k = block.rfind(b"\n", i, _BLANKS.match(block, i).end())
                if k >= 0:
                    line_no += block.count(b"\n", i, k + 1)
                    offset, i = offset + k + 1 - i, k + 1
                    continue
            nl = block.find(b"\n", i)
            end = len(block) if nl < 0 else nl + 1
            pending.append(block[i:end])
            held += end - i
            if held > max_line:
                raise _line_too_long(path, line_no + 1, max_line)
            i = end
            if nl < 0:
                continue
            line, pending, held = b"".join(pending), [], 0
            line_no += 1
            if stop is not None and offset >= stop:
                return
            offset += len(line)
            if line.strip():
                yield line_no, line, offset
    if pending and (stop is None or offset < stop):
        line = b"".join(pending)
        if line.strip():
            yield line_no + 1, line, offset + len(line)


def _blocks(f, path: Path, max_text: int | None):
    """The file's text in blocks; corrupt compression and text past `max_text` are one
    KolibriError naming the file."""
    total = 0
    while True:
        try:
            block = f.read(BLOCK_BYTES)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise KolibriError(f"{path}: corrupt or truncated compressed data ({e}); recompress "
                               "it or read it as plain JSONL") from None
        except OSError as e:
            raise KolibriError(f"{path}: cannot read it ({e.strerror or e})") from None
        except Exception as e:  # zstandard.ZstdError (an optional package)
            if type(e).__name__ != "ZstdError":
                raise
            raise KolibriError(f"{path}: corrupt or truncated zstd data ({e})") from None
        if not block:
            return
        total += len(block)
        if max_text is not None and total > max_text:
            raise KolibriError(
                f"{path}: its text passes {max_text >> 20} MB, more than {_expansion()}x "
                f"the compressed file (a compression bomb?); set {EXPANSION_VAR} higher to "
                "read it anyway")
        yield block


def _max_text(path: Path) -> int | None:
    """How much text a compressed file may expand to (None: a plain file is its own size)."""
    if not is_compressed(path):
        return None
    return max(MIN_TEXT_BYTES, _expansion() * path.stat().st_size)


def _expansion() -> int:
    """The expansion limit in force: the default, or KOLIBRI_MAX_EXPANSION."""
    return _limit(EXPANSION_VAR, MAX_EXPANSION)


def _limit(var: str, default: int) -> int:
    value = os.environ.get(var)
    if value is None or value == "":
        return default
    if not value.isascii() or not value.isdigit() or not 0 < int(value) < 2**40:
        raise KolibriError(f"{var}={shown(value)}: expected a whole number > 0")
    return int(value)


def _line_too_long(path: Path, line_no: int, max_line: int) -> KolibriError:
    return KolibriError(f"{path}:{line_no}: the line is longer than {max_line >> 20} MB (a golden "
                        f"is one line); set {MAX_LINE_VAR} higher to read it anyway")


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
        raise KolibriError(f"{path} is zstd-compressed: pip install 'kolibri-cli[zstd]' (or "
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
    except RecursionError:
        raise KolibriError(f"{_HERE}: JSON nested ~1,000 levels deep; a golden is an object of "
                           "lists and strings") from None
    except ValueError:  # Python's int limit
        raise KolibriError(f"{_HERE}: a number of more than 4,300 digits; token ids are below "
                           "2^31") from None
    if not isinstance(obj, dict):
        raise KolibriError(f"{_HERE}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _where(piece: Piece, line_no: int) -> str:
    """"path:line" — for a piece starting mid-file, its first line's number is counted (only
    when an error needs it)."""
    if piece.start:
        with _open(Path(piece.path)) as f:
            left = piece.start
            while left > 0:  # in blocks: the piece may start gigabytes in
                block = f.read(min(left, BLOCK_BYTES))
                if not block:
                    break
                line_no += block.count(b"\n")
                left -= len(block)
    return f"{piece.path}:{line_no}"


def models_of(paths: list) -> set[tuple[str, str]]:
    """{(name, sha256)} of the models the goldens were recorded from, by the first golden of
    each file (a file holds one model's chains)."""
    models = set()
    for file in find_golden_files(paths):
        first = next(iter_goldens([file]), None)
        if first is not None:
            models.add((first.model, first.model_sha256))
    return models
