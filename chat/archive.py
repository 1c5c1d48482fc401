"""Zip archives of exports (one JSON file a profile), written plainly and read warily: an
archive nobody vouches for may be a bomb, name paths outside any folder, or hold links.

Reading never extracts to disk: each entry is read into memory, within bounds checked
before and while it is read (the sizes an archive declares are not believed). Refused: more
than `MAX_ENTRIES` entries; a name that is not a plain file name ending in `.json` (so no
`../`, no absolute path, no folder); a name twice; a link, or anything but a regular file;
an encrypted entry; a compression method but stored and deflate; an entry, or all of them,
past `MAX_FILE_BYTES`; an entry that inflates more than `MAX_RATIO` times its compressed size.
"""

from __future__ import annotations

import io
import re
import stat
import zipfile
import zlib
from collections.abc import Mapping

from chat.limits import MAX_FILE_BYTES, ImportLimitError, refuse

MAX_ENTRIES = 1000
MAX_RATIO = 200
"""Deflate reaches about 1000:1 on runs of one byte; JSON text compresses 5-20:1."""
_DAMAGE = (
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    OSError,
    ValueError,
    UnicodeError,
    NotImplementedError,
    RuntimeError,
)
"""What zipfile raises on a damaged or unusual archive (a bad deflate stream, a version or
a method it does not know, a seek before the start, a name that does not decode)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.json")
_CHUNK = 1 << 16


def write_archive(entries: Mapping[str, bytes]) -> bytes:
    """A zip archive of `entries` (name → bytes), deflated."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def read_archive(data: bytes) -> dict[str, bytes]:
    """The entries of a zip archive, name → bytes, each checked (`ImportLimitError`)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except _DAMAGE as exc:
        raise refuse("the archive", f"not a zip archive ({exc})") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_ENTRIES:
            raise refuse("the archive", f"{len(infos):,} entries (bound {MAX_ENTRIES})")
        entries: dict[str, bytes] = {}
        total = 0
        for info in infos:
            _check_entry(info, entries)
            entries[info.filename] = _read_entry(archive, info, MAX_FILE_BYTES - total)
            total += len(entries[info.filename])
    return entries


def _check_entry(info: zipfile.ZipInfo, seen: Mapping[str, bytes]) -> None:
    name = info.filename
    shown = f"the archive's entry {name!r:.80}"
    if _NAME.fullmatch(name) is None:
        raise refuse(shown, "not a plain file name ending in .json (no folders, no ../)")
    if name in seen:
        raise refuse(shown, "named twice")
    kind = stat.S_IFMT(info.external_attr >> 16)  # none at all from some zip writers
    if kind and kind != stat.S_IFREG:
        raise refuse(shown, "a link or another special file, not a regular file")
    if info.flag_bits & 0x1:
        raise refuse(shown, "encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise refuse(shown, f"compression method {info.compress_type} (stored or deflate only)")


def _read_entry(archive: zipfile.ZipFile, info: zipfile.ZipInfo, room: int) -> bytes:
    """The entry's bytes, read a piece at a time: never more than `room`, nor more than
    `MAX_RATIO` times its compressed size, whatever its header says."""
    shown = f"the archive's entry {info.filename!r:.80}"
    bound = min(room, max(info.compress_size, 1) * MAX_RATIO)
    pieces: list[bytes] = []
    read = 0
    try:
        with archive.open(info) as entry:
            while piece := entry.read(_CHUNK):
                read += len(piece)
                if read > bound:
                    what = "inflates past" if bound < room else "past"
                    raise refuse(shown, f"{what} {bound:,} bytes (a zip bomb?)")
                pieces.append(piece)
    except ImportLimitError:
        raise
    except _DAMAGE as exc:
        raise refuse(shown, f"damaged ({exc})") from None
    return b"".join(pieces)
