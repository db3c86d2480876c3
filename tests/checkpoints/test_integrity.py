"""Weights in transit and at rest: no poisoned cache, no silent corruption (deepvit_mm.checkpoints
fetch and integrity). "Remote" files come from a loopback server; the hub from a cache laid out as
huggingface_hub lays it out, offline."""
import glob
import hashlib
import json
import os
import random
import subprocess
import sys
import time
import zipfile

import pytest
import torch
from conftest import CONFIG_DIR, ROOT, serve

from deepvit_mm import XCiT
from deepvit_mm.checkpoints import CheckpointError, fetch, read_checkpoint, resolve_checkpoint


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    """A real backbone checkpoint (zip format, as torch.save writes it) with mmengine-like meta,
    and its tensors."""
    torch.manual_seed(0)
    model = XCiT(arch='nano_12_p16', out_indices=(0, 1, 2, 3))
    sd = model.state_dict()
    path = tmp_path_factory.mktemp('ckpt') / 'xcit.pth'
    torch.save({'state_dict': sd, 'meta': {'epoch': 3, 'seed': 0, 'hook_msgs': {'x': [1.5]}}},
               str(path))
    return str(path), sd


@pytest.fixture
def flaky_server(tmp_path):
    """``conftest.serve`` over ``tmp_path/www``: the folder, the URL, ``cut``, the requests."""
    www = tmp_path / 'www'
    www.mkdir()
    with serve(www) as (url, hits, cut):
        yield www, url, cut, hits


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _files(folder):
    """The folder's files but the download lock and failure note (``<name>.lock``, ``.failed``)."""
    return sorted(n for n in os.listdir(folder) if not n.endswith(('.lock', '.failed')))


# ------------------------------------------------------------------------------ downloads
def test_cut_download_leaves_nothing_and_the_next_try_loads(saved, flaky_server, hub_dir,
                                                            monkeypatch):
    monkeypatch.setattr(fetch, 'RETRIES', 0)  # retries: test_transient_errors_are_retried
    www, url, cut, hits = flaky_server
    path, sd = saved
    data = open(path, 'rb').read()
    (www / 'xcit.pth').write_bytes(data)
    cut['xcit.pth'] = len(data) // 2
    with pytest.raises(CheckpointError, match=rf'ended after {len(data) // 2} of the {len(data)} '
                                              r'bytes announced.*Nothing was kept; try again'):
        read_checkpoint(f'{url}/xcit.pth')
    assert _files(hub_dir) == []  # nothing under the final name, no temporary file
    got = read_checkpoint(f'{url}/xcit.pth')['state_dict']  # the server is healthy again
    assert _equal(got, sd) and hits == ['/xcit.pth', '/xcit.pth']
    assert _files(hub_dir) == ['xcit.pth', 'xcit.pth.sha256']
    record = json.loads((hub_dir / 'xcit.pth.sha256').read_text())
    assert record == dict(url=f'{url}/xcit.pth', size=len(data),
                          sha256=hashlib.sha256(data).hexdigest())
    read_checkpoint(f'{url}/xcit.pth')
    assert len(hits) == 2  # cached and checked: not downloaded again


@pytest.mark.slow
def test_killed_download_leaves_nothing_and_its_temporary_is_cleared(saved, flaky_server, hub_dir):
    """A process killed (SIGKILL) in the middle of a download: nothing under the final name; the
    next try downloads again, and clears the temporary once it is abandoned (not before: it could
    be another process's live download)."""
    import signal
    import threading
    www, url, cut, hits = flaky_server
    path, sd = saved
    data = open(path, 'rb').read()
    (www / 'xcit.pth').write_bytes(data)
    release = threading.Event()
    cut['xcit.pth'] = (len(data) // 2, release)
    env = dict(os.environ, TORCH_HOME=str(hub_dir.parent.parent))  # its hub/checkpoints: hub_dir
    child = subprocess.Popen(
        [sys.executable, '-c', 'import sys; sys.path.insert(0, sys.argv[1]); '
         'from deepvit_mm.checkpoints import read_checkpoint; read_checkpoint(sys.argv[2])',
         ROOT, f'{url}/xcit.pth'], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not [p for p in glob.glob(str(hub_dir / '*.partial')) if os.path.getsize(p)]:
            assert child.poll() is None and time.time() < deadline, child.stderr.read()[-2000:]
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        assert child.wait(60) == -signal.SIGKILL
    finally:
        release.set()
        child.kill()
    (partial,) = glob.glob(str(hub_dir / 'xcit.pth.*.partial'))  # the kill left its temporary
    assert _files(hub_dir) == [os.path.basename(partial)]
    assert _equal(read_checkpoint(f'{url}/xcit.pth')['state_dict'], sd)  # downloads again
    assert os.path.exists(partial)  # too recent to be taken for abandoned
    os.remove(hub_dir / 'xcit.pth')
    from deepvit_mm.checkpoints.fetch import ABANDONED_AFTER_S
    abandoned = time.time() - ABANDONED_AFTER_S - 1
    os.utime(partial, (abandoned, abandoned))
    assert _equal(read_checkpoint(f'{url}/xcit.pth')['state_dict'], sd)
    assert _files(hub_dir) == ['xcit.pth', 'xcit.pth.sha256']
    assert hits == ['/xcit.pth'] * 3



@pytest.mark.parametrize('failure', ['HTTP 503', 'cut short'])
def test_transient_errors_are_retried(saved, flaky_server, hub_dir, monkeypatch, logged, failure):
    """A server that fails twice, then serves: the third try loads, each retry logged."""
    monkeypatch.setattr(fetch, 'BACKOFF_S', 0.01)
    www, url, cut, hits = flaky_server
    path, sd = saved
    data = open(path, 'rb').read()
    (www / 'xcit.pth').write_bytes(data)
    if failure == 'HTTP 503':
        cut['xcit.pth'] = [503, 503]
    else:
        cut['xcit.pth'] = len(data) // 3
        first_try = fetch._download_once

        def cut_twice(*args):  # the server cuts one transfer; this makes it two
            if len(hits) == 1:
                cut['xcit.pth'] = len(data) // 3
            return first_try(*args)
        monkeypatch.setattr(fetch, '_download_once', cut_twice)
    assert _equal(read_checkpoint(f'{url}/xcit.pth')['state_dict'], sd)
    assert hits == ['/xcit.pth'] * 3 and _files(hub_dir) == ['xcit.pth', 'xcit.pth.sha256']
    retries = [m for m in logged if 'Trying again in' in m]
    assert len(retries) == 2 and '(1 of 3 retries)' in retries[0] and '(2 of 3 retries)' in retries[1]


def test_a_missing_file_is_not_retried(flaky_server, hub_dir):
    www, url, cut, hits = flaky_server
    with pytest.raises(CheckpointError, match=r"cannot download '.*/nothing\.pth': HTTP Error 404"):
        read_checkpoint(f'{url}/nothing.pth')
    assert hits == ['/nothing.pth'] and _files(hub_dir) == []


def _read_together(url, barrier, n, conn):
    """In a forked process: wait until ``n`` processes are at ``barrier``, then read ``url``; send
    back the exit code and one line."""
    torch.set_num_threads(1)  # OpenMP's pool is the parent's: the child computes on one thread
    open(os.path.join(barrier, str(os.getpid())), 'w').close()
    while len(os.listdir(barrier)) < n:  # every process started: they ask at the same moment
        time.sleep(0.01)
    try:
        sd = read_checkpoint(url)['state_dict']
        conn.send((0, f'loaded {sum(float(v.double().sum()) for v in sd.values())}'))
    except CheckpointError as e:
        conn.send((3, f'refused {e}'))
    except BaseException as e:  # noqa: BLE001  (whatever else, to the test's message)
        conn.send((1, repr(e)))


def _together(url, hub_dir, barrier, n):
    """``n`` processes that read ``url`` at the same moment (one cache: ``hub_dir``, which they
    inherit as the test's torch hub folder); their exit codes and last lines. The processes are
    forks of this one (what they test is the cache's lock between processes, not their start)."""
    import multiprocessing
    barrier.mkdir()
    ctx = multiprocessing.get_context('fork')
    pipes = [ctx.Pipe(duplex=False) for _ in range(n)]
    procs = [ctx.Process(target=_read_together, args=(url, str(barrier), n, send))
             for _, send in pipes]
    for p in procs:
        p.start()
    try:
        results = [recv.recv() if recv.poll(300) else (None, 'no answer in 300 s')
                   for recv, _ in pipes]
    finally:
        for p in procs:
            p.join(30)
            p.kill()
    return results


def test_processes_of_one_cache_download_once(saved, flaky_server, hub_dir, tmp_path):
    """4 processes (the ranks of a job, or jobs sharing a home directory) want the same URL at
    once: one request; every process loads the same verified tensors."""
    www, url, cut, hits = flaky_server
    (www / 'xcit.pth').write_bytes(open(saved[0], 'rb').read())
    results = _together(f'{url}/xcit.pth', hub_dir, tmp_path / 'barrier', 4)
    assert [r[0] for r in results] == [0] * 4, results
    assert len({r[1] for r in results}) == 1 and results[0][1].startswith('loaded'), results
    assert hits == ['/xcit.pth'] and _files(hub_dir) == ['xcit.pth', 'xcit.pth.sha256']


def test_a_server_that_always_fails_stops_every_process_with_one_message(flaky_server, hub_dir,
                                                                         tmp_path, monkeypatch):
    """The process that downloads tries RETRIES + 1 times; the others, which waited for it, stop
    with its message instead of trying in turn; nothing is left but the lock and the note."""
    www, url, cut, hits = flaky_server
    (www / 'xcit.pth').write_bytes(b'never served')
    cut['xcit.pth'] = [503] * 100
    monkeypatch.setattr(fetch, 'BACKOFF_S', 0.05)  # the processes are forks: they inherit it
    start = time.time()
    results = _together(f'{url}/xcit.pth', hub_dir, tmp_path / 'barrier', 3)
    assert [r[0] for r in results] == [3] * 3, results
    (message,) = {r[1] for r in results}
    assert message.startswith(f"refused cannot download '{url}/xcit.pth': HTTP Error 503") and \
        message.endswith(f'(tried {fetch.RETRIES + 1} times)'), message
    assert len(hits) == fetch.RETRIES + 1 and _files(hub_dir) == []
    backoff = sum(fetch.BACKOFF_S * 2 ** i for i in range(fetch.RETRIES))
    assert time.time() - start < backoff + 60  # the back-off: no hang

@pytest.mark.parametrize('how', ['half file, no record', 'bytes changed, record kept'])
def test_poisoned_cache_is_fetched_again_once(saved, flaky_server, hub_dir, how, logged):
    www, url, cut, hits = flaky_server
    path, sd = saved
    data = open(path, 'rb').read()
    (www / 'xcit.pth').write_bytes(data)
    hub_dir.mkdir(parents=True)
    if how.startswith('half'):  # what torch.hub.download_url_to_file left after a cut transfer
        (hub_dir / 'xcit.pth').write_bytes(data[:len(data) // 2])
    else:
        read_checkpoint(f'{url}/xcit.pth')
        bad = bytearray(data)
        bad[len(bad) // 2] ^= 0xFF
        (hub_dir / 'xcit.pth').write_bytes(bytes(bad))
        hits.clear()
    got = read_checkpoint(f'{url}/xcit.pth')['state_dict']
    assert _equal(got, sd) and hits == ['/xcit.pth']
    (warning,) = [m for m in logged if 'fails its check' in m]
    assert warning.startswith(f'the cached {hub_dir / "xcit.pth"} fails its check (')
    assert warning.endswith(f'): downloading {url}/xcit.pth again (level 30)')


def test_sha256_in_the_file_name_is_checked(saved, flaky_server, hub_dir):
    """torch hub's convention: ``name-<first hex digits of the SHA-256>.pth``."""
    www, url, cut, hits = flaky_server
    data = open(saved[0], 'rb').read()
    good = hashlib.sha256(data).hexdigest()[:10]
    (www / f'xcit-{good}.pth').write_bytes(data)
    (www / 'xcit-0123456789.pth').write_bytes(data)
    assert read_checkpoint(f'{url}/xcit-{good}.pth')['meta']['epoch'] == 3
    with pytest.raises(CheckpointError, match=r'has SHA-256 [0-9a-f]{64}, expected 0123456789.*'
                                              r'Nothing was kept'):
        read_checkpoint(f'{url}/xcit-0123456789.pth')
    assert _files(hub_dir) == [f'xcit-{good}.pth', f'xcit-{good}.pth.sha256']


# ------------------------------------------------------------------------------ hub names
def _hf_cache(root, repo, files):
    """A cache as huggingface_hub lays it out: blobs named by SHA-256, a snapshot of links."""
    folder = root / ('models--' + repo.replace('/', '--'))
    commit = 'a' * 40
    (folder / 'blobs').mkdir(parents=True)
    (folder / 'refs').mkdir()
    (folder / 'refs' / 'main').write_text(commit)
    snap = folder / 'snapshots' / commit
    snap.mkdir(parents=True)
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        (folder / 'blobs' / sha).write_bytes(data)
        os.symlink(f'../../blobs/{sha}', snap / name)
    return folder


def _offline(code, hf_home):
    env = dict(os.environ, HF_HOME=str(hf_home), HF_HUB_OFFLINE='1', PYTHONWARNINGS='ignore')
    return subprocess.run([sys.executable, '-c', 'import sys; sys.path.insert(0, sys.argv[1]); '
                           + code, ROOT], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_hub_name_from_an_offline_cache(tmp_path):
    """An ``hf-hub:`` name read from a huggingface_hub cache offline: loaded whole, a changed blob
    refused, an uncached one named. ~10-15 s: one process (huggingface_hub reads HF_HOME and
    HF_HUB_OFFLINE when imported), which reads the three in turn."""
    import timm
    from safetensors.torch import save_file
    torch.manual_seed(0)
    timm_model = timm.create_model('xcit_nano_12_p16_224')
    save_file(timm_model.state_dict(), str(tmp_path / 'model.safetensors'))
    data = (tmp_path / 'model.safetensors').read_bytes()
    folder = _hf_cache(tmp_path / 'hf' / 'hub', 'timm/xcit_nano_12_p16_224.fb_in1k',
                       {'model.safetensors': data, 'config.json': b'{}'})
    torch.save(timm_model.state_dict(), str(tmp_path / 'want.pth'))
    blob = folder / 'blobs' / hashlib.sha256(data).hexdigest()  # the weights' blob, not config.json's
    code = f"""
import torch, deepvit_mm
from mmdet.registry import MODELS
from deepvit_mm.checkpoints import read_checkpoint
m = MODELS.build(dict(type="XCiT", arch="nano_12_p16", init_cfg=dict(type="Pretrained",
                      checkpoint="hf-hub:timm/xcit_nano_12_p16_224.fb_in1k")))
m.init_weights()
want = torch.load({str(tmp_path / 'want.pth')!r})
print('loaded', all(torch.equal(m.state_dict()["trunk." + k], v) for k, v in want.items()
                    if "trunk." + k in m.state_dict()), flush=True)
# a blob whose bytes changed (no second copy to fetch), then a name not cached
data = open({str(blob)!r}, 'rb').read()
open({str(blob)!r}, 'wb').write(data[:-1] + bytes([data[-1] ^ 1]))
for name in ('xcit_nano_12_p16_224', 'xcit_tiny_12_p8_224'):
    try:
        read_checkpoint(f'hf-hub:timm/{{name}}.fb_in1k')
        print(name, 'read', flush=True)
    except Exception as e:
        print('@@', name, type(e).__name__, e, file=sys.stderr, flush=True)
"""
    out = _offline(code, tmp_path / 'hf')
    assert out.returncode == 0 and 'loaded True' in out.stdout, out.stderr[-3000:]
    assert 'loaded 351 tensors' in out.stdout + out.stderr or 'loaded 350 tensors' in out.stdout + out.stderr
    changed, uncached = (e for e in out.stderr.split('@@ ')[1:])
    assert changed.startswith('xcit_nano_12_p16_224 CheckpointError')
    assert 'is corrupt: its SHA-256 is not' in changed, out.stderr[-2000:]
    # not cached, offline: which file to get and where
    assert uncached.startswith('xcit_tiny_12_p8_224 ')
    assert ("'hf-hub:timm/xcit_tiny_12_p8_224.fb_in1k' is not in the Hugging Face cache" in uncached
            and 'HF_HUB_OFFLINE is set' in uncached
            and 'hf download timm/xcit_tiny_12_p8_224.fb_in1k model.safetensors' in uncached
            and 'https://huggingface.co/timm/xcit_tiny_12_p8_224.fb_in1k/resolve/main/'
                'model.safetensors' in uncached), out.stderr[-2000:]


# ------------------------------------------------------------------------------ at rest
def _zip_regions(path):
    """Byte ranges of a torch zip file: local headers, the pickle, tensor data, the central
    directory (with the end record)."""
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        start_dir = z.start_dir
    size = os.path.getsize(path)
    regions = {'local headers': [], 'pickle': [], 'tensor data': []}
    with open(path, 'rb') as f:
        for i in infos:
            f.seek(i.header_offset + 26)
            n, m = int.from_bytes(f.read(2), 'little'), int.from_bytes(f.read(2), 'little')
            data = i.header_offset + 30 + n + m
            regions['local headers'].append((i.header_offset, data))
            if i.file_size:
                kind = 'pickle' if i.filename.endswith('.pkl') else \
                    'tensor data' if '/data/' in i.filename else 'local headers'
                regions[kind].append((data, data + i.compress_size))
    regions['central directory'] = [(start_dir, size)]
    return regions


def test_a_zip_whose_bytes_changed_is_refused_before_loading(saved, tmp_path):
    path, _ = saved
    data = bytearray(open(path, 'rb').read())
    data[_zip_regions(path)['tensor data'][3][0] + 5] ^= 0x40  # one bit of one weight
    bad = tmp_path / 'bad.pth'
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"bad\.pth' is truncated or corrupt: record "
                                              r"'.*/data/\d+' fails its CRC-32 check.*nothing "
                                              r'was loaded from it\. Download or save it again'):
        read_checkpoint(str(bad))


@pytest.mark.slow
def test_fuzz_every_corruption_is_refused_or_loads_the_saved_tensors(saved, tmp_path):
    """300 corrupted copies of a real checkpoint (seeded): 1-64 bytes overwritten in the zip's
    local headers, the pickle, tensor data or the central directory, and truncations. Each is
    refused with CheckpointError or loads tensors equal to the saved ones; nothing else."""
    path, sd = saved
    data = open(path, 'rb').read()
    regions = _zip_regions(path)
    rng = random.Random(0)
    outcomes = {}
    for i in range(300):
        kind = ['local headers', 'pickle', 'tensor data', 'central directory', 'truncated'][i % 5]
        bad = bytearray(data)
        if kind == 'truncated':
            bad = bad[:rng.randrange(1, len(data))]
        else:
            lo, hi = rng.choice(regions[kind])
            at = rng.randrange(lo, hi)
            n = rng.randint(1, 64)
            bad[at:at + n] = bytes(rng.randrange(256) for _ in range(len(bad[at:at + n])))
        if bytes(bad) == data:
            continue
        f = tmp_path / f'{i}.pth'
        f.write_bytes(bytes(bad))
        try:
            got = read_checkpoint(str(f))['state_dict']
        except CheckpointError:
            outcomes.setdefault(kind, []).append('refused')
        else:
            assert _equal(got, sd), f'{kind} corruption #{i} loaded different tensors'
            outcomes.setdefault(kind, []).append('equal')
        f.unlink()
    assert set(outcomes) == {'local headers', 'pickle', 'tensor data', 'central directory',
                             'truncated'}
    # every change to the pickle, tensor data or the length is caught
    for kind in ('pickle', 'tensor data', 'truncated'):
        assert set(outcomes[kind]) == {'refused'}, kind


def _central_entries(data, start_dir):
    """Offsets of the central directory's file headers (signature PK\\x01\\x02)."""
    out, at = [], start_dir
    while data[at:at + 4] == b'PK\x01\x02':
        out.append(at)
        n, m, k = (int.from_bytes(data[at + o:at + o + 2], 'little') for o in (28, 30, 32))
        at += 46 + n + m + k
    return out


@pytest.mark.parametrize('where', ['local header', 'central directory'])
@pytest.mark.parametrize('field', ['encrypted flag', 'strong encryption flag', 'deflate method',
                                   'unknown method'])
def test_damaged_zip_header_fields_are_refused(saved, tmp_path, where, field):
    """Header fields that make Python's zip reader raise something other than BadZipFile (the
    fuzz met "File ... is encrypted" on torch 2.1's layout). Readers take flags and method from
    the central directory: changed there, the file is refused like any other damage; changed in
    a local header only, the file is refused or its tensors load unchanged."""
    path, sd = saved
    data = bytearray(open(path, 'rb').read())
    with zipfile.ZipFile(path) as z:
        info = [i for i in z.infolist() if '/data/' in i.filename][0]
        start_dir = z.start_dir
    if where == 'local header':
        at, flags, method = info.header_offset, 6, 8
    else:
        at = [e for e in _central_entries(data, start_dir)
              if int.from_bytes(data[e + 42:e + 46], 'little') == info.header_offset][0]
        flags, method = 8, 10
    if field.endswith('flag'):
        data[at + flags] |= 0x01 if field == 'encrypted flag' else 0x40
    else:
        data[at + method:at + method + 2] = (8 if field == 'deflate method' else 99).to_bytes(2, 'little')
    bad = tmp_path / 'bad.pth'
    bad.write_bytes(bytes(data))
    if where == 'central directory':
        with pytest.raises(CheckpointError, match=r'is truncated or corrupt: its zip structure'):
            read_checkpoint(str(bad))
        return
    try:
        got = read_checkpoint(str(bad))['state_dict']
    except CheckpointError:
        return
    assert _equal(got, sd)


def test_resolve_checkpoint_keeps_local_paths_local(saved):
    assert resolve_checkpoint(saved[0]) == saved[0]


# ------------------------------------------------------------------------------ recipes
RECIPES = sorted(glob.glob(os.path.join(CONFIG_DIR, '*.py')))  # the recipes, not _base_ or demo


class _FakeResponse:
    """What ``urllib.request.urlopen`` returns, for bytes served without a network."""

    def __init__(self, data):
        self.data, self.headers = data, {'Content-Length': str(len(data))}

    def read(self, n=-1):
        out, self.data = (self.data, b'') if n < 0 else (self.data[:n], self.data[n:])
        return out

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@pytest.fixture
def network(monkeypatch, hub_dir):
    """``urlopen`` served from ``files`` (URL -> bytes), every request recorded."""
    import deepvit_mm.checkpoints.fetch as fetch
    files, asked = {}, []

    def urlopen(request, timeout=None):
        asked.append(request.full_url)
        return _FakeResponse(files[request.full_url])
    monkeypatch.setattr(fetch.urllib.request, 'urlopen', urlopen)
    return files, asked


@pytest.mark.slow
def test_every_recipe_fetches_its_imagenet_weights_itself(network, hub_dir):
    """No recipe needs a file downloaded by hand: its backbone's ``pretrained`` is the official
    release's URL, fetched once into the cache by the loader (network monkeypatched)."""
    from mmengine.config import Config
    files, asked = network
    urls = {}
    for path in RECIPES:
        cfg = Config.fromfile(path)
        url = cfg.model.backbone.init_cfg.checkpoint
        # the releases' own hosts: XCiT, CaiT and MAE (Meta), BEiT (microsoft/unilm)
        assert url.startswith(('https://dl.fbaipublicfiles.com/',
                               'https://conversationhub.blob.core.windows.net/beit-share-public/')), \
            (path, url)
        urls[os.path.basename(path)] = url
    for url in set(urls.values()):
        files[url] = url.encode()  # any bytes: resolving fetches, reading is tested elsewhere
        assert resolve_checkpoint(url) == str(hub_dir / os.path.basename(url))
    assert sorted(asked) == sorted(set(urls.values()))  # each once
    assert len(urls) >= 24


@pytest.mark.slow
def test_a_recipe_trains_from_its_fetched_weights(network, hub_dir):
    """The T12/16 Mask R-CNN recipe's backbone initialised from its URL: fetched, checked, loaded
    through the matcher."""
    import timm
    from mmdet.registry import MODELS
    from mmengine.config import Config
    files, asked = network
    cfg = Config.fromfile(os.path.join(ROOT, 'configs', 'mask_rcnn_xcit_t12_16_3x.py'))
    release = timm.create_model('xcit_tiny_12_p16_224').state_dict()
    path = hub_dir.parent / 'release.pth'
    hub_dir.mkdir(parents=True)
    torch.save({'model': release}, str(path))  # the official layout: a dict under 'model'
    files[cfg.model.backbone.init_cfg.checkpoint] = path.read_bytes()
    backbone = MODELS.build(dict(cfg.model.backbone, norm_cfg=dict(type='BN')))
    backbone.init_weights()
    assert asked == ['https://dl.fbaipublicfiles.com/xcit/xcit_tiny_12_p16_224.pth']
    got = backbone.state_dict()
    assert all(torch.equal(got['trunk.' + k], v) for k, v in release.items() if 'trunk.' + k in got)
    assert sum('trunk.' + k in got for k in release) > 300
