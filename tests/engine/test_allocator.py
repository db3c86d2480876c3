"""The CPU runs' malloc: which one a process runs on, finding tcmalloc, the tools' restart with it
preloaded (same process id, flags and arguments; never twice; only as the tool itself), and
glibc's tuning. A stand-in library named like tcmalloc (a copy of libm) exercises the restart on
machines without tcmalloc; the real one is used where the system has it."""
import os
import platform
import shutil
import subprocess
import sys

import pytest
from conftest import DEMO_DET, ROOT

from deepvit_mm.engine import allocator_note, cpu_allocator, preload_tcmalloc
from deepvit_mm.engine.allocator import MALLOC_ENV, find_tcmalloc

GLIBC = sys.platform.startswith('linux') and platform.libc_ver()[0] == 'glibc'
needs_glibc = pytest.mark.skipif(not GLIBC, reason='the restart is for Linux processes on glibc')
# deepvit_mm/engine/allocator.py in a child process, read from its file: it imports the standard
# library only, and the restart is about the process, not about importing the package (the tools'
# tests start them); a child then costs a Python start, not torch's and the libraries' imports.
ALLOCATOR = os.path.join(ROOT, 'deepvit_mm', 'engine', 'allocator.py')
LOAD = ('import importlib.util; '
        f'spec = importlib.util.spec_from_file_location("allocator", {ALLOCATOR!r}); '
        'allocator = importlib.util.module_from_spec(spec); spec.loader.exec_module(allocator)\n')
TOOL = LOAD + '''import os, sys
print('start', os.getpid(), allocator.cpu_allocator(), sys.flags.dont_write_bytecode, sys.argv[1:],
      flush=True)
print('continues', allocator.preload_tcmalloc({script}), os.environ.get('LD_PRELOAD', ''), flush=True)
'''


def _maps_with(tmp_path, line):
    p = tmp_path / 'maps'
    p.write_text('7f00-7f10 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n' + line)
    return str(p)


@pytest.mark.parametrize('line, expected', [
    ('7f20-7f30 r-xp 0 08:01 2 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10\n',
     'tcmalloc'),
    ('7f20-7f30 r-xp 0 08:01 2 /opt/conda/lib/libtcmalloc.so.4\n', 'tcmalloc'),
    ('7f20-7f30 r-xp 0 08:01 2 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n', 'jemalloc'),
    ('7f20-7f30 r-xp 0 08:01 2 /usr/lib/x86_64-linux-gnu/libm.so.6\n', 'glibc'),
])
def test_cpu_allocator_reads_what_is_mapped(tmp_path, line, expected):
    assert cpu_allocator(_maps_with(tmp_path, line)) == expected


def test_cpu_allocator_without_proc_maps(tmp_path):
    assert cpu_allocator(str(tmp_path / 'absent')) == 'unknown'


def test_find_tcmalloc_follows_the_setting(tmp_path, monkeypatch):
    lib = tmp_path / 'lib' / 'libtcmalloc_minimal.so.4'
    lib.parent.mkdir()
    lib.write_bytes(b'')
    monkeypatch.setenv(MALLOC_ENV, 'glibc')
    assert find_tcmalloc() is None
    monkeypatch.setenv(MALLOC_ENV, str(lib))
    assert find_tcmalloc() == str(lib)
    monkeypatch.setenv(MALLOC_ENV, str(tmp_path / 'nope.so'))
    with pytest.raises(FileNotFoundError, match='no such file.*"glibc" to keep'):
        find_tcmalloc()
    monkeypatch.delenv('CONDA_PREFIX', raising=False)
    monkeypatch.setenv('VIRTUAL_ENV', str(tmp_path))  # an environment that ships one comes first
    for auto in ('auto', 'tcmalloc', ''):
        monkeypatch.setenv(MALLOC_ENV, auto)
        assert find_tcmalloc() == str(lib)


def test_allocator_note_says_what_to_do(monkeypatch):
    monkeypatch.delenv(MALLOC_ENV, raising=False)
    assert allocator_note('tcmalloc') == 'CPU memory allocator: tcmalloc'
    note = allocator_note('glibc')
    assert 'no tcmalloc found' in note and 'libtcmalloc-minimal4' in note
    monkeypatch.setenv(MALLOC_ENV, 'glibc')
    assert f'({MALLOC_ENV}=glibc)' in allocator_note('glibc')


def test_preload_returns_when_not_run_as_the_tool(monkeypatch, tmp_path):
    """Called from this test process (pytest is not the script), it never restarts it."""
    monkeypatch.setenv(MALLOC_ENV, str(_stand_in(tmp_path)))
    assert preload_tcmalloc(os.path.join(ROOT, 'tools', 'train.py')) == cpu_allocator()


def _stand_in(tmp_path) -> str:
    """A loadable library named like tcmalloc: a copy of the libm this process has mapped."""
    with open('/proc/self/maps') as f:
        libm = next((ln.split()[-1] for ln in f if ln.rstrip().endswith(('/libm.so.6',))), None)
    if libm is None:
        pytest.skip('no libm.so.6 mapped to copy as a stand-in')
    lib = tmp_path / 'libtcmalloc_minimal.so.4'
    shutil.copy(libm, lib)
    return str(lib)


def _clean_env() -> dict:
    """This environment without a preload or a past restart (CI may run under either)."""
    return {k: v for k, v in os.environ.items()
            if k not in ('LD_PRELOAD', 'DEEPVIT_MALLOC_RESTARTED')}


def _run_tool(tmp_path, env, flags=()):
    tool = tmp_path / 'tool.py'
    tool.write_text(TOOL.format(script='__file__'))
    env = dict(_clean_env(), PYTHONPATH=ROOT, **env)
    out = subprocess.run([sys.executable, *flags, str(tool), 'a', '--b'], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return [ln.split(' ', 1) for ln in out.stdout.splitlines()]


@needs_glibc
def test_tool_restarts_once_with_tcmalloc_preloaded(tmp_path):
    """A tool started with the stand-in allocator restarts itself once with it preloaded and goes
    on, with its interpreter flags (-B) and arguments."""
    lib = _stand_in(tmp_path)
    lines = _run_tool(tmp_path, {MALLOC_ENV: lib}, flags=('-B',))
    (s1, before), (s2, after), (s3, continues) = lines
    assert (s1, s2, s3) == ('start', 'start', 'continues')
    pid1, malloc1, opt1, args1 = before.split(' ', 3)
    pid2, malloc2, opt2, args2 = after.split(' ', 3)
    assert pid1 == pid2  # exec: the same process, so a launcher waiting for it still waits
    assert (malloc1, malloc2) == ('glibc', 'tcmalloc')
    assert opt1 == opt2 == '1' and args1 == args2 == "['a', '--b']"  # flags and arguments kept
    assert continues == f'tcmalloc {lib}'


@needs_glibc
@pytest.mark.parametrize('case', ['glibc chosen', 'already loaded'])
def test_tool_is_not_restarted(tmp_path, case):
    """A tool with glibc chosen, or the allocator already preloaded, is not restarted."""
    lib = _stand_in(tmp_path)
    env = {MALLOC_ENV: 'glibc'} if case == 'glibc chosen' else {MALLOC_ENV: lib, 'LD_PRELOAD': lib}
    lines = _run_tool(tmp_path, env)
    assert [s for s, _ in lines] == ['start', 'continues']
    assert lines[1][1].split(' ')[0] == ('glibc' if case == 'glibc chosen' else 'tcmalloc')


@needs_glibc
def test_a_preload_that_does_not_load_is_not_retried(tmp_path):
    """The restart happened but the library did not load (ld.so ignores it): no second restart."""
    bad = tmp_path / 'libtcmalloc.so.4'
    bad.write_bytes(b'not a library')
    lines = _run_tool(tmp_path, {MALLOC_ENV: str(bad)})
    assert [s for s, _ in lines] == ['start', 'start', 'continues']
    assert lines[2][1].split(' ')[0] == 'glibc'


@needs_glibc
@pytest.mark.slow
def test_train_tool_runs_on_the_preloaded_allocator(shapes, tmp_path):
    """tools/train.py restarts itself with the library and logs the allocator; tcmalloc itself when
    the system has one, else the stand-in."""
    try:
        lib = find_tcmalloc()
    except FileNotFoundError:
        lib = None
    lib = lib or _stand_in(tmp_path)
    cmd = [sys.executable, os.path.join(ROOT, 'tools', 'train.py'), DEMO_DET, '--work-dir',
           str(tmp_path / 'work'), '--cfg-options', f'train_dataloader.dataset.data_root={shapes}/',
           'model.backbone.arch=nano_12_p16', 'train_dataloader.batch_size=1',
           'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
           'train_dataloader.dataset.pipeline.2.scale=(96,64)',
           'train_dataloader.dataset.pipeline.2.keep_ratio=False',
           'model.train_cfg.rcnn.sampler.num=32', 'train_cfg.max_iters=2',
           'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None',
           'param_scheduler.0.end=1', 'param_scheduler.1.begin=1', 'param_scheduler.1.end=2',
           'default_hooks.logger.interval=1', 'default_hooks.checkpoint.interval=100']
    env = _clean_env()
    env.update(PYTHONWARNINGS='ignore', OMP_NUM_THREADS='2', **{MALLOC_ENV: lib})
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'CPU memory allocator: tcmalloc' in out.stdout + out.stderr
    assert 'Iter(train) [2/2]' in out.stdout + out.stderr


@needs_glibc
@pytest.mark.slow
def test_missing_library_is_refused_by_the_tool(tmp_path):
    """A tool given an allocator library that is not there stops naming it. ~10 s: a tool's process."""
    env = dict(_clean_env(), **{MALLOC_ENV: str(tmp_path / 'libtcmalloc.so.4')})
    out = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'train.py'), DEMO_DET,
                          '--work-dir', str(tmp_path / 'work')], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert 'no such file' in out.stderr and 'Traceback' not in out.stderr
    assert not (tmp_path / 'work').exists()


@pytest.mark.slow
def test_keep_freed_cpu_memory_applies_on_glibc():
    """In a child process: the malloc settings are process-wide and would outlive this test."""
    code = (LOAD + 'import torch; applied = allocator.keep_freed_cpu_memory(); '
            'x = torch.randn(1, 64, 64, 64); '
            'y = torch.nn.functional.conv2d(x, torch.randn(64, 1, 3, 3), groups=64); '
            'print(applied, bool(torch.isfinite(y).all()))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(_clean_env(), PYTHONPATH=ROOT), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(GLIBC), 'True']  # allocations still work afterwards


@needs_glibc
@pytest.mark.slow
def test_keep_freed_cpu_memory_leaves_tcmalloc_alone(tmp_path):
    """...and a benchmark report's environment names the allocator."""
    code = ('from deepvit_mm.engine import keep_freed_cpu_memory, cpu_allocator; '
            'from deepvit_tools.benchmark import environment; '
            'print(cpu_allocator(), keep_freed_cpu_memory(), environment("cpu")["malloc"])')
    lib = _stand_in(tmp_path)
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(_clean_env(), PYTHONPATH=ROOT, LD_PRELOAD=lib), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ['tcmalloc', 'False', 'tcmalloc']


@needs_glibc
@pytest.mark.slow
def test_release_free_memory_gives_tcmallocs_cache_back(tmp_path):
    """tcmalloc keeps freed memory (the point of it) until asked; then the resident set falls. The
    real library where the system has one; on glibc the call trims and says so."""
    try:
        lib = find_tcmalloc()
    except FileNotFoundError:
        lib = None
    code = (LOAD + 'import torch; cpu_allocator = allocator.cpu_allocator\n'
            'def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20\n'
            'x = [torch.ones(64, 2**20) for _ in range(8)]; del x\n'  # 8 x 256 MiB, freed
            'held = rss(); done = allocator.release_free_memory()\n'
            'print(cpu_allocator(), done, round(held - rss()))')
    env = dict(_clean_env(), PYTHONPATH=ROOT, **({'LD_PRELOAD': lib} if lib else {}))
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    malloc, done, released = out.stdout.split()
    assert (malloc, done) == ('tcmalloc' if lib else 'glibc', 'True')
    if lib:
        assert int(released) > 1500  # MiB of the 2048 freed (it holds them until asked)
