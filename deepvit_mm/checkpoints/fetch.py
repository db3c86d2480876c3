"""Where a checkpoint comes from: a local path, an ``http(s)://`` URL, or a Hugging Face hub name.

* **Local paths**: ``~`` expanded; a folder or a missing file is refused with what to do.
* **URLs** are downloaded once into torch's hub cache (``<torch.hub.get_dir()>/checkpoints``, the
  folder ``torch.hub.load_state_dict_from_url`` and mmengine use). The transfer streams into a
  temporary file beside the final name and is renamed to it only once every announced byte has
  arrived (``Content-Length``) and, where one is known, the SHA-256 matches: torch hub's file-name
  convention ``name-<first hex digits of the SHA-256>.pth``, or ``sha256=`` given by the caller.
  A record ``<name>.sha256`` (size and SHA-256) is written beside it. Before each use the cached
  file is checked against its record (a file without one, left by torch hub, mmengine or an
  interrupted older download, against its format's own checksums); one that fails is fetched again
  once, with a message. An interrupted download (a closed connection, a timeout, a killed process)
  never leaves a file under the final name. A killed process cannot remove its temporary file:
  the next download of that file removes the ones nobody has written to for an hour.
  **One download per cache**: the processes that want the same file (the ranks of a job on one
  machine, or several jobs sharing a home directory) take a file lock ``<name>.lock`` beside it;
  the first downloads while the others wait, then they read the checked file. A transient error
  (a reset or refused connection, a time-out, HTTP 5xx/408/429, a transfer that ends short) is
  retried ``RETRIES`` times with backoff; a download that still fails leaves ``<name>.failed``
  (its message), and the processes that waited for it stop with the same message at once rather
  than trying in turn.
* **Hub names** ``hf-hub:<repo>[@revision]`` (timm's names: ``hf-hub:timm/xcit_small_12_p8_224.fb_in1k``)
  are fetched by ``huggingface_hub``, with its cache, token and ``HF_HUB_OFFLINE``: the repository's
  ``model.safetensors``, else its ``pytorch_model.bin``. Its cache keeps each file under its SHA-256
  (the blob's name), which is checked before use.
"""
import json
import os
import re
import tempfile
import time
import urllib.request
from typing import Optional, Tuple
from urllib.parse import urlparse

import torch

from .errors import SHARDED_HINT, CheckpointError
from .integrity import sha256_of, structure_problem

__all__ = ['resolve_checkpoint', 'download']

HUB_PREFIX = 'hf-hub:'
HUB_FILES = ('model.safetensors', 'pytorch_model.bin')
TIMEOUT_S = 60
RETRIES = 3  # after the first try; waits BACKOFF_S, then twice as long each time
BACKOFF_S = 1.0
PROGRESS_FROM_BYTES = 8 << 20  # smaller downloads show no progress bar
# a download's temporary file untouched this long was left by a killed process: a live one
# writes every MiB (a transfer slower than ~300 B/s would be taken for dead)
ABANDONED_AFTER_S = 3600
# torch.hub.HASH_REGEX: the file name's last `-<hex>` part before the extension
_NAME_SHA = re.compile(r'-([a-f0-9]{8,64})\.')


def _log(msg: str, warning: bool = False) -> None:
    import logging

    from mmengine.logging import print_log
    print_log(msg, logger='current', level=logging.WARNING if warning else logging.INFO)


# --------------------------------------------------------------------------------------------
# URLs
# --------------------------------------------------------------------------------------------
def _record_path(path: str) -> str:
    return path + '.sha256'


def _read_record(path: str) -> Optional[dict]:
    try:
        with open(_record_path(path)) as f:
            rec = json.load(f)
        return rec if isinstance(rec, dict) and {'size', 'sha256'} <= set(rec) else None
    except (OSError, ValueError):
        return None


def cached_download_problem(path: str) -> Optional[str]:
    """None if the cached ``path`` is what was downloaded (its record's size and SHA-256; without
    a record, its format's own checksums), else what differs."""
    rec = _read_record(path)
    if rec is None:
        return structure_problem(path)
    size = os.path.getsize(path)
    if size != rec['size']:
        return f'it has {size} bytes, its download recorded {rec["size"]}'
    if sha256_of(path) != rec['sha256']:
        return 'its SHA-256 differs from the one recorded at download'
    return None


def _expected_sha(name: str, sha256: Optional[str]) -> Optional[str]:
    if sha256:
        return sha256.lower()
    m = _NAME_SHA.search(name)
    return m.group(1) if m else None


class _Transient(CheckpointError):
    """A failure that another try may not meet: a connection error, a time-out, HTTP 5xx, 408 or
    429, a transfer that ended short."""


def _is_transient(e: BaseException) -> bool:
    import http.client
    import socket
    import urllib.error
    if isinstance(e, urllib.error.HTTPError):
        return e.code >= 500 or e.code in (408, 429)
    return isinstance(e, (urllib.error.URLError, http.client.HTTPException, ConnectionError,
                          socket.timeout, TimeoutError))


def download(url: str, path: str, sha256: Optional[str] = None) -> None:
    """Fetch ``url`` to ``path`` (see the module docstring): all or nothing under ``path``,
    transient errors retried ``RETRIES`` times.

    Args:
        url (str): An ``http(s)://`` URL.
        path (str): The final file name.
        sha256 (str, optional): The expected SHA-256 or a prefix of it (hex). Default: the one in
            the file name (torch hub's ``name-<hex>.pth``), if any.

    Raises:
        CheckpointError: The transfer failed or ended short, or the SHA-256 differs. Nothing is
            left under ``path`` nor beside it.
    """
    for attempt in range(RETRIES + 1):
        try:
            return _download_once(url, path, sha256)
        except _Transient as e:
            if attempt == RETRIES:
                raise CheckpointError(f'{e} (tried {RETRIES + 1} times)') from e.__cause__
            wait = BACKOFF_S * 2 ** attempt
            _log(f'{e} Trying again in {wait:.0f} s ({attempt + 1} of {RETRIES} retries).',
                 warning=True)
            time.sleep(wait)


def _download_once(url: str, path: str, sha256: Optional[str]) -> None:
    import hashlib

    from tqdm import tqdm
    expected = _expected_sha(os.path.basename(path), sha256)
    folder = os.path.dirname(path)
    _remove_abandoned_temporaries(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + '.', suffix='.partial')
    try:
        h, got, total = hashlib.sha256(), 0, None
        with os.fdopen(fd, 'wb') as f:
            try:
                request = urllib.request.Request(url, headers={'User-Agent': 'deepvit_mm'})
                with urllib.request.urlopen(request, timeout=TIMEOUT_S) as r:
                    length = r.headers.get('Content-Length')
                    total = int(length) if length and length.isdigit() else None
                    with tqdm(total=total, unit='B', unit_scale=True, unit_divisor=1024,
                              desc=os.path.basename(path),
                              disable=(total or 0) < PROGRESS_FROM_BYTES) as bar:
                        while True:
                            block = r.read(1 << 20)
                            if not block:
                                break
                            f.write(block)
                            h.update(block)
                            got += len(block)
                            bar.update(len(block))
            except Exception as e:  # HTTPError, URLError, timeouts, IncompleteRead, resets...
                raise (_Transient if _is_transient(e) else CheckpointError)(
                    f'cannot download {url!r}: {e}. Nothing was kept; check the URL and the '
                    'network and try again, or download the file yourself and give its local '
                    'path.') from e
            f.flush()
            os.fsync(f.fileno())
        if total is not None and got != total:
            raise _Transient(
                f'the download of {url!r} ended after {got} of the {total} bytes announced (the '
                'connection closed early). Nothing was kept; try again.')
        digest = h.hexdigest()
        if expected and not digest.startswith(expected):
            raise CheckpointError(
                f'the download of {url!r} has SHA-256 {digest}, expected {expected}: the file on '
                'the server is not the one named. Nothing was kept.')
        os.replace(tmp, path)
        with open(_record_path(path), 'w') as f:
            json.dump(dict(url=url, size=got, sha256=digest), f)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _remove_abandoned_temporaries(path: str) -> None:
    """Delete the temporary files of earlier downloads of ``path`` that were killed (see
    ``ABANDONED_AFTER_S``); another process's live download of it keeps its own."""
    import glob
    for tmp in glob.glob(glob.escape(path) + '.*.partial'):
        try:
            if time.time() - os.path.getmtime(tmp) > ABANDONED_AFTER_S:
                os.remove(tmp)
                _log(f'removed {tmp}, left by a download that was killed')
        except OSError:  # removed meanwhile by another process
            pass


def _fetch_url(url: str, sha256: Optional[str] = None) -> str:
    name = os.path.basename(urlparse(url).path)
    if not name:
        raise CheckpointError(f'cannot tell a file name from the URL {url!r}: it must end in the '
                              'checkpoint\'s file name (…/model.pth).')
    folder = os.path.join(torch.hub.get_dir(), 'checkpoints')
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    from filelock import FileLock
    asked = time.time()
    with FileLock(path + '.lock'):  # one process downloads, the others wait for its file
        if os.path.isfile(path):
            problem = cached_download_problem(path)
            if problem is None:
                expected = _expected_sha(name, sha256)
                # a record was just checked against the file: its SHA-256 is the file's
                if not expected or ((_read_record(path) or {}).get('sha256')
                                    or sha256_of(path)).startswith(expected):
                    return path
                problem = f'its SHA-256 is not {expected}'
            _log(f'the cached {path} fails its check ({problem}): downloading {url} again',
                 warning=True)
            os.remove(path)
            if os.path.exists(_record_path(path)):
                os.remove(_record_path(path))
        failed = _read_failure(path)
        if failed and failed['time'] >= asked:  # while this process waited for the lock
            raise CheckpointError(failed['message'])
        _log(f'downloading {url} to {path}')
        try:
            download(url, path, sha256)
        except CheckpointError as e:
            _write_failure(path, str(e))
            raise
        if os.path.exists(path + '.failed'):
            os.remove(path + '.failed')
    return path


def _read_failure(path: str) -> Optional[dict]:
    try:
        with open(path + '.failed') as f:
            rec = json.load(f)
        return rec if isinstance(rec, dict) and {'time', 'message'} <= set(rec) else None
    except (OSError, ValueError):
        return None


def _write_failure(path: str, message: str) -> None:
    with open(path + '.failed', 'w') as f:
        json.dump(dict(time=time.time(), message=message), f)


# --------------------------------------------------------------------------------------------
# hub names
# --------------------------------------------------------------------------------------------
def _split_hub_name(name: str) -> Tuple[str, Optional[str]]:
    repo = name[len(HUB_PREFIX):]
    repo, _, revision = repo.partition('@')
    if repo.count('/') != 1 or not all(repo.split('/')):
        raise CheckpointError(f'{name!r} is not a hub name: use hf-hub:<owner>/<repo>, e.g. '
                              'hf-hub:timm/xcit_small_12_p8_224.fb_in1k.')
    return repo, revision or None


def _verified_blob(path: str) -> Optional[str]:
    """None if a huggingface_hub cache file matches the SHA-256 its blob is named by (LFS files;
    small git files are named by a SHA-1 of another form and are not checked), else the problem."""
    blob = os.path.basename(os.path.realpath(path))
    if re.fullmatch(r'[0-9a-f]{64}', blob) and sha256_of(path) != blob:
        return f'its SHA-256 is not {blob}, the one the hub cache stores it under'
    return None


def _fetch_hub(name: str) -> str:
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
    repo, revision = _split_hub_name(name)
    offline = []
    for filename in HUB_FILES:
        try:
            path = hf_hub_download(repo, filename, revision=revision)
        except LocalEntryNotFoundError as e:  # not cached, and offline or unreachable
            offline.append(str(e).splitlines()[0])
            continue
        except EntryNotFoundError:  # the repository has no such file
            continue
        except Exception as e:  # RepositoryNotFoundError, HTTP errors...
            raise CheckpointError(f'cannot fetch {name!r} from the Hugging Face hub: '
                                  f'{type(e).__name__}: {str(e).splitlines()[0]}') from e
        problem = _verified_blob(path)
        if problem and not constants.HF_HUB_OFFLINE:
            _log(f'{path} in the Hugging Face cache fails its check ({problem}): downloading it '
                 'again', warning=True)
            path = hf_hub_download(repo, filename, revision=revision, force_download=True)
            problem = _verified_blob(path)
        if problem:
            raise CheckpointError(f'{path} ({name}) in the Hugging Face cache is corrupt: '
                                  f'{problem}. Delete it and fetch it again.')
        return path
    if offline:
        raise CheckpointError(
            f'{name!r} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and the hub '
            f'cannot be reached ({"HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else offline[0]}). '
            f'On a machine with network run `hf download {repo} {HUB_FILES[0]}` (the cache can be '
            f'copied), or download https://huggingface.co/{repo}/resolve/main/{HUB_FILES[0]} and '
            'give its local path instead of the hub name.')
    raise CheckpointError(f'{name!r}: the repository has neither {" nor ".join(HUB_FILES)}.')


# --------------------------------------------------------------------------------------------
def resolve_checkpoint(path: str, sha256: Optional[str] = None) -> str:
    """A local, existing checkpoint file for ``path``: ``~`` expanded, URLs and hub names fetched
    once and checked (see the module docstring).

    Args:
        path (str): A file, ``~/...``, an ``http(s)://`` URL or ``hf-hub:<owner>/<repo>``.
        sha256 (str, optional): For URLs: the expected SHA-256 (or a prefix of it).

    Raises:
        FileNotFoundError: The path does not exist, or names a folder (the message lists the
            checkpoints in it).
        CheckpointError: A download or hub fetch failed, or fetched bytes failed their check.
    """
    path = os.fspath(path)
    if path.startswith(('http://', 'https://')):
        return _fetch_url(path, sha256)
    if path.startswith(HUB_PREFIX):
        return _fetch_hub(path)
    full = os.path.expanduser(path)
    if os.path.isdir(full):
        found = sorted(n for n in os.listdir(full)
                       if n.endswith(('.pth', '.pt', '.bin', '.safetensors')))
        if found and all(re.fullmatch(r'rank\d+\.pth', n) for n in found):
            raise CheckpointError(f'{path!r} is a sharded checkpoint ({", ".join(found[:4])}'
                                  f'{" ..." if len(found) > 4 else ""}): {SHARDED_HINT}')
        raise FileNotFoundError(
            f'{path!r} is a folder, not a checkpoint file: give the file '
            + (f'(it holds {", ".join(found[:6])}{" ..." if len(found) > 6 else ""})'
               if found else '(it holds no .pth/.safetensors file)') + '.')
    if not os.path.isfile(full):
        raise FileNotFoundError(
            f'checkpoint not found: {path!r}. Check the path (relative paths are resolved from '
            f'{os.getcwd()!r}) or download the weights first.')
    return full
