"""A record's images (#62): where each reference points (a path relative to ``data.media_dir`` or the data file's
directory, an absolute path, or an object-storage URI read with fsspec), the image decoded with Pillow and bounded
by ``data.image_max_pixels`` / ``data.image_min_pixels`` as LLaMA-Factory bounds it (scaled by the square root of
the pixel ratio, the aspect kept, then RGB), and a digest of the images' bytes for the data cache's key.

A reference that cannot be read is an ``ImageProblem`` naming the reference and why (missing, not an image,
truncated, a store that does not answer): the data step names the record and stops, never trains on the text
without the image the user gave.
"""

from __future__ import annotations

import hashlib
import io
import math
from pathlib import Path

from scaletrain.data.containers import ROW, in_container, row_bytes

URI_SEP = "://"


class ImageProblem(Exception):
    """An image reference that cannot be trained on: the message names it and why."""


def resolve(ref: str, base: str) -> str:
    """The path or URI an image reference points to: URIs and absolute paths as given, a relative path under
    ``base`` (data.media_dir, or the data file's directory)."""
    if URI_SEP in ref or Path(ref).is_absolute():
        return ref
    return str(Path(base).expanduser() / ref) if URI_SEP not in base else f"{base.rstrip('/')}/{ref}"


def read_bytes(where: str) -> bytes:
    """The file's bytes (a local path, or an fsspec URI: s3://, gs://, memory://, tar://MEMBER::SHARD...), or an
    image's bytes inside a Parquet/Arrow file (``row://``, data/containers.py)."""
    if where.startswith(ROW):
        try:
            return row_bytes(where)
        except (OSError, IndexError, KeyError, ValueError) as e:
            raise ImageProblem(f"image {where} cannot be read from its file ({type(e).__name__}: {e})") from None
    if URI_SEP not in where:
        try:
            return Path(where).read_bytes()
        except FileNotFoundError:
            raise ImageProblem(f"image {where} does not exist") from None
        except OSError as e:
            raise ImageProblem(f"image {where} cannot be read ({e.strerror or e})") from None
    import fsspec

    try:
        with fsspec.open(where, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ImageProblem(f"image {where} does not exist") from None
    except ImportError as e:
        raise ImageProblem(f"image {where}: its store needs a package that is not installed ({e}); install the "
                           f"matching extra (scaletrain[s3], [gcs], [azure])") from None
    except Exception as e:  # noqa: BLE001 - a store that does not answer, refuses the credentials...: said, with why
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ImageProblem(f"image {where} cannot be read from its store ({type(e).__name__}: {first})") from None


def open_image(data: bytes, where: str, max_pixels: int, min_pixels: int):
    """The decoded RGB image, bounded in pixels (LLaMA-Factory's ``_preprocess_image``)."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        image.load()  # decode now: a truncated file fails here, not in the processor
    except UnidentifiedImageError:
        raise ImageProblem(f"image {where} is not an image Pillow can read") from None
    except (OSError, SyntaxError) as e:
        raise ImageProblem(f"image {where} is damaged or truncated ({e})") from None
    return bounded(image, max_pixels, min_pixels)


def bounded(image, max_pixels: int, min_pixels: int):
    """``image`` scaled to at most ``max_pixels`` and at least ``min_pixels`` pixels (aspect kept), in RGB."""
    size = bounded_size(*image.size, max_pixels, min_pixels)
    if size != image.size:
        image = image.resize(size)
    return image.convert("RGB") if image.mode != "RGB" else image


def bounded_size(width: int, height: int, max_pixels: int, min_pixels: int) -> tuple[int, int]:
    """The (width, height) ``bounded`` gives an image of ``width`` x ``height`` pixels: the data step sizes an image's
    tokens from this and the file's header alone (#73), the loader's workers decode it at that size."""
    if width * height > max_pixels:
        factor = math.sqrt(max_pixels / (width * height))
        return max(1, int(width * factor)), max(1, int(height * factor))
    if width * height < min_pixels:
        factor = math.sqrt(min_pixels / (width * height))
        return int(width * factor), int(height * factor)
    return width, height


def image_size(data: bytes, where: str) -> tuple[int, int]:
    """(width, height) from an image's header, without decoding its pixels (Pillow reads the header on open)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except UnidentifiedImageError:
        raise ImageProblem(f"image {where} is not an image Pillow can read") from None
    except (OSError, SyntaxError) as e:
        raise ImageProblem(f"image {where} is damaged or truncated ({e})") from None


def load_images(refs: list[str], base: str, max_pixels: int, min_pixels: int) -> list:
    """A record's images, decoded and bounded, in order."""
    images = []
    for ref in refs:
        where = _where(ref, base)
        images.append(open_image(read_bytes(where), where, max_pixels, min_pixels))
    return images


def sized_images(refs: list[str], base: str, max_pixels: int, min_pixels: int) -> list[tuple[str, tuple[int, int]]]:
    """Where each of a record's images is and its size once bounded, from the headers (the data step, #73)."""
    out = []
    for ref in refs:
        where = _where(ref, base)
        out.append((where, bounded_size(*image_size(read_bytes(where), where), max_pixels, min_pixels)))
    return out


def _where(ref, base: str) -> str:
    """The reference resolved; a local path made absolute (the cache keeps it for workers with other directories)."""
    if not isinstance(ref, str) or not ref.strip():
        raise ImageProblem(f"image reference {ref!r} is not a path or URI")
    where = resolve(ref, base)
    return where if URI_SEP in where else str(Path(where).absolute())


def images_digest(columns: list[list], base: str) -> str:
    """A digest of every referenced image's bytes (the data cache's key covers the images, not only their names:
    an image replaced under the same path is tokenized again); a reference that cannot be read is left to the
    data step, which names its record."""
    h = hashlib.sha256()
    for refs in columns:
        for ref in refs or []:
            h.update(str(ref).encode())
            if in_container(str(ref)):  # inside a data file: its content hash is in the cache key already
                continue
            try:
                h.update(hashlib.sha256(read_bytes(resolve(str(ref), base))).digest())
            except ImageProblem:
                h.update(b"unreadable")
    return h.hexdigest()[:16]


def media_base(media_dir: str | None, data_path: str) -> str:
    """Where a source's relative image paths start: data.media_dir, else the data file's directory."""
    if media_dir:
        return media_dir
    return data_path.rsplit("/", 1)[0] if URI_SEP in data_path else str(Path(data_path).parent)


def sources_digest(srcs: list, media_dir: str | None, encoding: str) -> str:
    """``images_digest`` of every source whose records have images (a vision-language job's cache key)."""
    import tempfile

    from scaletrain.data.sources import load

    parts = []
    with tempfile.TemporaryDirectory(prefix="scaletrain-hf-") as hf_cache:
        for src in srcs:
            ds = load(src.path, src.file_format, src.key, hf_cache, encoding, src.origin).ds
            if src.columns.images in ds.column_names:
                parts.append(images_digest(ds[src.columns.images], media_base(media_dir, src.path)))
    return ",".join(parts)
