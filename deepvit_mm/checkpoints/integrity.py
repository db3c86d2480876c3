"""Whether a checkpoint's bytes are the ones that were written, before anything reads them.

* torch zip files (``torch.save``'s default format) store a CRC-32 per record, which PyTorch's
  reader does not check: ``zip_problem`` reads every record and checks them all (its cost:
  docs/weights.md#what-is-verified), and the archive's structure with them.
* ``.safetensors`` files: safetensors' reader checks that their header describes exactly the bytes
  that follow (``safetensors_problem``); the tensor bytes have no checksum.
* legacy (non-zip) ``.pth`` files have neither: only a SHA-256 recorded at download
  (``deepvit_mm.checkpoints.fetch``) or known in advance verifies them.
"""
import hashlib
import zipfile
from typing import Optional

__all__ = ['sha256_of', 'zip_problem']


def sha256_of(path: str, chunk: int = 1 << 22) -> str:
    """The SHA-256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        while True:
            block = f.read(chunk)
            if not block:
                return h.hexdigest()
            h.update(block)


def is_safetensors(path: str) -> bool:
    """By name or by content: 8-byte little-endian header length, then a JSON object."""
    if path.endswith('.safetensors'):
        return True
    with open(path, 'rb') as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b'{' and int.from_bytes(head[:8], 'little') < (1 << 28)


def is_zip(path: str) -> bool:
    """A zip archive, or what is left of one (its first record's magic bytes): torch's format."""
    with open(path, 'rb') as f:
        return f.read(4) == b'PK\x03\x04' or zipfile.is_zipfile(path)


def zip_problem(path: str) -> Optional[str]:
    """None if ``path`` is a zip archive whose structure reads and whose every record matches its
    CRC-32; else what is wrong, naming the record."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except Exception as e:  # noqa: BLE001 - damaged headers raise many types (BadZipFile, a
        # flag read as "encrypted": RuntimeError, a method read as "deflate": zlib.error, ...);
        # each one means the archive is not the one torch.save wrote.
        return f'its zip structure is damaged ({type(e).__name__}: {e})'
    if bad is not None:
        return f'record {bad!r} fails its CRC-32 check'
    return None


def safetensors_problem(path: str) -> Optional[str]:
    """None if safetensors' own reader accepts the file (its header must describe exactly the
    bytes that follow: a truncated or extended file is refused); else its error."""
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(path, 'pt') as f:
            f.keys()
    except (SafetensorError, ValueError, OSError) as e:
        return f'safetensors cannot read it ({e})'
    return None


def structure_problem(path: str) -> Optional[str]:
    """The format's own check where it has one (zip CRC-32, safetensors header); None for legacy
    pickle files, which have none."""
    if is_safetensors(path):
        return safetensors_problem(path)
    if is_zip(path):
        return zip_problem(path)
    return None
