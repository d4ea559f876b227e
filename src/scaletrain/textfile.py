"""Text files read as text: UTF-8, or one line naming the file and what it is instead.

A file that is not UTF-8 is named with the encoding it most likely has (a byte-order mark's, else Windows-1252
or Latin-1 when its bytes read as text) or said to be binary, so the advice fits the cause: random bytes are
never told "set encoding=latin-1" (which would decode anything, and train on garbage).
"""

from __future__ import annotations

from pathlib import Path

from scaletrain.errors import ConfigError

BOMS = ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"), (b"\xff\xfe", "utf-16"),
        (b"\xfe\xff", "utf-16"))


def guess_encoding(data: bytes) -> str | None:
    """The encoding a non-UTF-8 file probably has, or None when its bytes are not text in any usual encoding."""
    for bom, name in BOMS:
        if data.startswith(bom):
            return name
    if b"\x00" in data:
        return None  # NUL bytes: binary (UTF-16 without a mark is rare in the files people train on)
    for name in ("cp1252", "latin-1"):
        try:
            text = data.decode(name)
        except UnicodeDecodeError:
            continue
        controls = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r\f")
        # a text in a legacy 8-bit encoding has its accents among mostly-ASCII letters; random bytes do not
        high = sum(1 for b in data if b >= 0x80)
        if controls <= len(text) // 1000 and high <= len(data) // 4:
            return name
    return None


def not_utf8(data: bytes, error: UnicodeDecodeError) -> str:
    """What a file that fails UTF-8 decoding is: 'line L is not UTF-8 (byte ... at offset N); it looks like
    cp1252', or 'line L is not text (binary data: ...)'."""
    line = data.count(b"\n", 0, error.start) + 1
    guess = guess_encoding(data)
    where = f"byte {data[error.start:error.start + 1]!r} at offset {error.start}"
    if guess is None:
        return f"line {line} is not text (binary data: {where}); it is not a text file"
    return f"line {line} is not UTF-8 ({where}); it looks like {guess}"


def read_text(path: str | Path, what: str) -> str:
    """The file's text (UTF-8, a byte-order mark allowed); ``what`` names it in the error (e.g. 'config file')."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except IsADirectoryError:
        raise ConfigError(f"{what} {p} is a directory; give the file") from None
    except OSError as e:
        raise ConfigError(f"{what} {p}: cannot read it ({e.strerror or e})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        guess = guess_encoding(data)
        fix = (f"save it as UTF-8 (iconv -f {guess} -t utf-8 {p.name} > {p.stem}.utf8{p.suffix})" if guess
               else "is this the right file?")
        raise ConfigError(f"{what} {p}: {not_utf8(data, e)}: {fix}") from None
