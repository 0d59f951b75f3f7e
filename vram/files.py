"""The one way `vram` reads (and writes) a file a person named: regular files only, never
more than a cap.

`stat().st_size` is 0 for devices and FIFOs, so a size check before reading protects nothing:
`/dev/zero` would be read until memory runs out and a FIFO would block forever. Here anything
but a regular file is refused before it is opened (opening a device can act), the file is
opened without blocking, checked again on the open descriptor (no race with a swapped path),
and read for at most `max_bytes + 1` bytes. Every failure is a `FileReadError`
(a `VramError`) that says what is wrong in words: no such file, a folder, a symlink loop, no
permission, not a regular file, too large. `write_text` is the same for an output a person
names (`export --out`): a FIFO (whose opening would wait for a reader), a device, a socket or a
folder is refused before it is opened, and what is opened is checked again on the descriptor.
"""

from __future__ import annotations

import csv
import errno
import io
import os
import stat
from pathlib import Path

from vram.errors import FileReadError, FileWriteError

_REASONS: dict[int, str] = {
    errno.ENOENT: "no such file",
    errno.ENOTDIR: "no such file (a part of the path is not a folder)",
    errno.ELOOP: "a symlink loop (the link points back to itself)",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EISDIR: "a folder, not a file",
    errno.ENAMETOOLONG: "the path is too long",
}


def _describe(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    if stat.S_ISFIFO(mode):
        return "a pipe (FIFO), not a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a regular file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a regular file"
    return "not a regular file"


def _shown(path: str | Path) -> str:
    """The path as it goes into a message: printable and short."""
    return repr(str(path)[:200]) if not str(path).isprintable() else str(path)[:200]


def read_limited(path: str | Path, max_bytes: int, *, what: str = "file") -> bytes:
    """The bytes of a regular file of at most `max_bytes`; raises FileReadError otherwise.

    Anything but a regular file is refused before it is opened (opening a device can act:
    a watchdog, a tape), and again after (a path swapped meanwhile; non-blocking, so a FIFO
    put there cannot hold the open)."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISREG(mode):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (ValueError, TypeError):  # an embedded NUL byte, or not a path at all
        raise FileReadError(what, _shown(path), "not a valid file name") from None
    except OSError as exc:
        reason = _REASONS.get(exc.errno or 0, exc.strerror or "cannot be opened")
        raise FileReadError(what, _shown(path), reason) from None
    if not stat.S_ISREG(mode):
        raise FileReadError(what, _shown(path), _describe(mode))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise FileReadError(what, _shown(path), _describe(mode))
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise FileReadError(what, _shown(path), exc.strerror or "cannot be read") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise FileReadError(what, _shown(path), f"too large (a {what} is at most "
                                                 f"{max_bytes:,} bytes)")
    return data


def read_limited_text(path: str | Path, max_bytes: int, *, what: str = "file") -> str:
    """`read_limited`, decoded as UTF-8 (a BOM is dropped); bad bytes are named by line."""
    data = read_limited(path, max_bytes, what=what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise FileReadError(what, _shown(path), f"line {line} is not UTF-8 text (byte "
                                                 f"{exc.start:,})") from None


#: A CSV a person points `vram` at (a team's GPU list, a case file) is at most this big.
MAX_CSV_BYTES = 20_000_000


def read_csv_rows(
    path: str | Path, *, what: str, required: tuple[str, ...] = (),
    max_bytes: int = MAX_CSV_BYTES,
) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) for every row of a UTF-8 CSV with a header; missing cells are "".

    Raises FileReadError naming the file and the line for anything that is not such a CSV:
    unreadable, too large, not UTF-8, a malformed line or a giant field, missing columns."""
    text = read_limited_text(path, max_bytes, what=what)
    reader = csv.DictReader(io.StringIO(text, newline=""), restval="")
    rows: list[tuple[int, dict[str, str]]] = []
    try:
        header = reader.fieldnames or []
        missing = [name for name in required if name not in header]
        if missing:
            shown = ", ".join(repr(h[:30]) for h in header[:8]) or "nothing"
            raise FileReadError(what, _shown(path), f"missing column(s) {', '.join(missing)} "
                                f"(line 1 has {shown})")
        for row in reader:
            rows.append((reader.line_num, row))
    except csv.Error as exc:
        raise FileReadError(what, _shown(path), f"line {reader.line_num + 1}: not CSV "
                            f"({str(exc)[:80]})") from None
    return rows


def write_text(path: str | Path, text: str, *, what: str = "output") -> None:
    """Write `text` (UTF-8) to a regular file, created or replaced; anything else named by
    `path` is refused with FileWriteError before it is opened."""
    try:
        mode: int | None = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None  # a new file
    except (ValueError, TypeError):
        raise FileWriteError(what, _shown(path), "not a valid file name") from None
    except OSError as exc:
        raise FileWriteError(what, _shown(path), _REASONS.get(
            exc.errno or 0, exc.strerror or "cannot be opened")) from None
    if mode is not None and not stat.S_ISREG(mode):
        raise FileWriteError(what, _shown(path), _describe(mode))
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:  # not truncated until it is known to be a regular file (a path swapped meanwhile)
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        raise FileWriteError(what, _shown(path), _REASONS.get(
            exc.errno or 0, exc.strerror or "cannot be opened")) from None
    try:
        opened = os.fstat(fd).st_mode
        if not stat.S_ISREG(opened):
            raise FileWriteError(what, _shown(path), _describe(opened))
        os.ftruncate(fd, 0)
        data = memoryview(text.encode("utf-8"))
        while data:
            data = data[os.write(fd, data):]
    except OSError as exc:
        raise FileWriteError(what, _shown(path), exc.strerror or "cannot be written") from None
    finally:
        os.close(fd)
