"""Shared fixtures and helpers of the tests.

* isolation: every test starts from seed 0 and from the default scope it found (mmengine's default
  scope is process-wide and ``init_default_scope`` / ``register_all_modules()`` would otherwise
  leave theirs to every later test);
* model builders: ``build_model`` (a config's detector or segmentor through mmdet's or mmseg's
  registry), ``config_from_text`` (a config written inline, over mmdet's/mmseg's own bases);
* tiny data: ``seg_inputs`` (a segmentation batch), ``finite_loss_and_grads`` (one training step
  of a built model), the ``shapes`` COCO-format demo dataset, ``official_xcit_state_dict``;
* ``randomize_`` (non-trivial BatchNorm statistics and LayerScale, so that comparisons see them);
* timm test models of BEiT and EVA-02 (``_TEST_MODELS``: timm has none), the families' smallest
  archs in ``TIMM_FAMILY_ARCHS``;
* ``server``: a local HTTP server for URL checkpoints; ``logged``: what went to mmengine's
  ``print_log``.

Test files import the helpers (``from conftest import build_model``), as pytest puts ``tests/`` on
``sys.path``; fixtures need no import.
"""
import contextlib
import copy
import gc
import http.server
import os
import sys
import textwrap
import threading

# OpenMP's threads sleep while they wait instead of spinning, here and in every process a test
# starts (they inherit it): with two test processes on two cores (and the tools they start), the
# spinning threads of one took the cores the other computed on; tests/models/test_architectures.py
# and tests/engine/hooks/test_resume.py on two processes ran in 492 s spinning, 183 s sleeping.
# Set before torch loads its OpenMP runtime, which reads it once.
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')
# torch.compile's kernels go to a folder of this run's (its processes inherit it; removed at the
# end by the process that made it): no kernel of another run, torch release or ISA is loaded.
_INDUCTOR_DIR = None
if 'TORCHINDUCTOR_CACHE_DIR' not in os.environ:
    import tempfile
    _INDUCTOR_DIR = os.environ['TORCHINDUCTOR_CACHE_DIR'] = tempfile.mkdtemp(
        prefix='deepvit_mm_tests_inductor_')

import pytest  # noqa: E402
import torch  # noqa: E402
from budget import (  # noqa: E402,F401
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

TESTS = os.path.dirname(os.path.abspath(__file__))  # the helpers (slow_save.py, rank_dump_hook.py)
ROOT = os.path.dirname(TESTS)
sys.path.insert(0, ROOT)

import deepvit_mm  # noqa: E402,F401  (registers the backbones)

# timm's test models of the families that have none (timm's own: test_vit, 64 wide, 2 heads, MLP
# ratio 3): timm's model class as the family's smallest release builds it, that narrow, with its
# 12 blocks (the taps 3/5/7/11). BEiT's smallest release is a base (86M parameters: its first 4
# blocks took 0.25 s to build), EVA-02's a tiny (5.7M, 192 wide); their code (BEiT's relative
# position bias of one grid and the padding to it, EVA-02's rotary embedding, SwiGLU and patch 14,
# LayerScale) is the same at any width.
_TEST_MODELS = {
    'beit': ('test_beit', '_create_beit', dict(
        patch_size=16, embed_dim=64, depth=12, num_heads=2, mlp_ratio=3, use_abs_pos_emb=False,
        use_rel_pos_bias=True, init_values=1e-5)),  # as beitv2_base_patch16_224
    'eva': ('test_eva', '_create_eva', dict(
        img_size=224, patch_size=14, embed_dim=64, depth=12, num_heads=2, mlp_ratio=3 * 2 / 3,
        swiglu_mlp=True, use_rot_pos_emb=True, ref_feat_shape=(16, 16))),  # as eva02_tiny_patch14_224
}


def _register_test_models() -> None:
    """Registers ``_TEST_MODELS`` in timm's registry as timm registers its own, each a name of its
    timm module (so that the family, whose arch table is that module's names, takes it), where the
    timm release has none of that name."""
    import importlib

    import timm
    from timm.models._registry import register_model
    for module, (name, create, model_args) in _TEST_MODELS.items():
        if name in timm.list_models(module=module):
            continue
        mod = importlib.import_module(f'timm.models.{module}')

        def entrypoint(pretrained=False, _name=name, _create=getattr(mod, create),
                       _args=model_args, **kwargs):
            return _create(_name, pretrained=pretrained, **dict(_args, **kwargs))

        entrypoint.__name__, entrypoint.__module__ = name, mod.__name__
        mod.default_cfgs[name] = mod._cfg()  # its pretrained config: no weights to download
        register_model(entrypoint)


_register_test_models()

CONFIG_DIR = os.path.join(ROOT, 'configs')
DEMO_DET = os.path.join(CONFIG_DIR, 'demo', 'mask_rcnn_xcit_nano_12_p8_shapes.py')
DEMO_SEG = os.path.join(CONFIG_DIR, 'demo', 'sem_fpn_xcit_nano_12_p16_ade_demo.py')
# timm's families take any name of their timm modules (their arch tables are timm's registry): the
# tests take each at its smallest size and at a larger one with another trait (patch 14 with
# register tokens, a distillation token); BEiT's and EVA-02's smallest are test models of timm's
# test size (_TEST_MODELS), beside timm's smallest BEiT, a base (its structure, on the meta device).
TIMM_FAMILY_ARCHS = {
    'TimmViT': ('vit_tiny_patch16_224', 'deit_tiny_distilled_patch16_224',
                'vit_small_patch14_reg4_dinov2'),
    'TimmEVA': ('test_eva', 'eva02_small_patch14_224'),
    'TimmBEiT': ('test_beit', 'beitv2_base_patch16_224'),
}


# BEiT pads every input to its position grid (timm's: 224 x 224); the tests that feed it small
# images and are not about that grid build it for 96 x 96 (a quarter of the forward's cost)
SMALL_GRID = {'TimmBEiT': dict(img_size=96)}


def family_archs(family) -> tuple:
    """The archs the tests take of a ``ColumnarBackbone`` family: every arch of a paper's table
    (XCiT, CaiT), ``TIMM_FAMILY_ARCHS`` of a timm family."""
    if family.__name__ in TIMM_FAMILY_ARCHS:
        return TIMM_FAMILY_ARCHS[family.__name__]
    return tuple(family.arch_zoo)


# Early taps prune a trunk to its first 4 blocks (timm's prune_intermediate_layers; CaiT does not
# even build the others): tests that are not about the default taps use them to stay fast.
EARLY = (0, 1, 2, 3)


def session_threads() -> int:
    """The threads each test process computes with: the cores shared among pytest-xdist's
    processes (one each for two processes on two cores), at most 2."""
    workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
    return max(1, min(2, torch.get_num_threads(), (os.cpu_count() or 1) // workers))


# the whole session (set once here; a test that changes it gives it back)
torch.set_num_threads(session_threads())


def pytest_report_header(config):
    """The CPU and the kernels torch runs on it, at the top of every run's report."""
    return (f'cpu: {cpu_model()}; torch kernels: {torch.backends.cpu.get_cpu_capability()}; '
            f'oneDNN: {"on" if torch.backends.mkldnn.enabled else "off"}')


def pytest_collection_modifyitems(config, items):
    """The files with the most work first (a test of several processes counts 10, a slow test 1,
    others 0), each file's tests in their order: pytest-xdist hands whole files to its processes
    in this order, so that the longest do not start last while the other process idles."""
    weight = {}
    for item in items:
        w = 10 if item.get_closest_marker('distributed') else int(
            item.get_closest_marker('slow') is not None)
        weight[item.path] = weight.get(item.path, 0) + w
    order = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-weight[item.path], order[item.path]))


def pytest_unconfigure(config):
    if _INDUCTOR_DIR is not None:
        import shutil
        shutil.rmtree(_INDUCTOR_DIR, ignore_errors=True)


def pytest_configure(config):
    """``ATEN_CPU_CAPABILITY`` (as ``make test-avx2`` sets it) must have taken effect: a torch
    that ignored it would run the AVX-512 kernels under the AVX2 run's name.

    Under ``ONEDNN_MAX_CPU_ISA=AVX2`` on an AVX-512 CPU, torch 2.1 still hands bfloat16
    convolutions and matrix products to oneDNN (it asks the CPU, not oneDNN, whether oneDNN can
    take them), and oneDNN, capped at AVX2, refuses them ("could not create a primitive
    descriptor"). An AVX2-only CPU never takes that path: torch runs its own bfloat16 kernels
    there. So where a bfloat16 convolution fails so, oneDNN is switched off for the run, and
    torch's own kernels run, as on an AVX2-only CPU; the processes the tests start keep oneDNN,
    without the cap."""
    want = os.environ.get('ATEN_CPU_CAPABILITY')
    have = torch.backends.cpu.get_cpu_capability()
    if want and want.upper() != have.upper():
        raise pytest.UsageError(f'ATEN_CPU_CAPABILITY={want} but torch runs its {have} kernels')
    if os.environ.get('ONEDNN_MAX_CPU_ISA', '').upper() == 'AVX2':
        try:
            torch.nn.functional.conv2d(torch.ones(1, 1, 3, 3, dtype=torch.bfloat16),
                                       torch.ones(1, 1, 1, 1, dtype=torch.bfloat16))
        except RuntimeError as e:
            if 'primitive descriptor' not in str(e):
                raise
            torch.backends.mkldnn.enabled = False
            # The processes the tests start (tools/train.py --amp) would meet the same refusal
            # and nothing outside them can switch oneDNN off: they run oneDNN's kernels for this
            # CPU (torch's own, ATEN_CPU_CAPABILITY, stay AVX2's).
            os.environ.pop('ONEDNN_MAX_CPU_ISA')


def cpu_model() -> str:
    """``/proc/cpuinfo``'s model name and its AVX-512 / AMX flags, as the figures name a CPU."""
    from kernels import cpu_flags
    try:
        with open('/proc/cpuinfo') as f:
            info = f.read()
    except OSError:
        return 'unknown'
    model = next((line.split(':', 1)[1].strip() for line in info.splitlines()
                  if line.startswith('model name')), 'unknown')
    flags = cpu_flags()
    shown = [f for f in ('avx2', 'avx512f', 'avx512_bf16', 'avx512_fp16', 'amx_bf16') if f in flags]
    return f"{model} ({' '.join(shown)})"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def _cpu_autocast_enabled() -> bool:
    try:
        return torch.is_autocast_enabled('cpu')
    except TypeError:  # torch < 2.4: no device argument
        return torch.is_autocast_cpu_enabled()


def _torch_state() -> dict:
    """The process-wide settings a test (or a tool run in its process) could leave behind,
    slowing or changing every later test of that process: torch's, ``LOCAL_RANK`` (set by
    tools/train.py) and the garbage collector's frozen objects (the tools freeze theirs)."""
    return dict(
        grad=torch.is_grad_enabled(), default_dtype=torch.get_default_dtype(),
        deterministic=torch.are_deterministic_algorithms_enabled(),
        cpu_autocast=_cpu_autocast_enabled(),
        function_modes=torch._C._len_torch_function_stack(),
        dispatch_modes=torch._C._len_torch_dispatch_stack(),
        threads=torch.get_num_threads(), environ_local_rank=os.environ.get('LOCAL_RANK'),
        gc_frozen=gc.get_freeze_count())


@pytest.fixture(autouse=True)
def _no_torch_state_left():
    """A test gives back the process-wide settings of ``_torch_state`` as it found them (it fails
    otherwise)."""
    before = _torch_state()
    yield
    after = _torch_state()
    left = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert not left, f'the test left torch settings changed (before, after): {left}'


def _managers() -> list:
    """mmengine's classes with a table of named instances (``ManagerMixin`` and its subclasses
    imported so far)."""
    from mmengine.utils import ManagerMixin
    found, todo = [], [ManagerMixin]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if '_instance_dict' in vars(cls):
            found.append(cls)
    return found


@pytest.fixture(autouse=True)
def _restore_mmengine_instances():
    """Whatever named instance a test makes (a default scope, a logger, a message hub, a
    visualizer writing into the test's folder) is gone after it, also of the classes first
    imported during the test; what existed before stays. (A later test's Runner would take an
    earlier one's visualizer, and write into that test's removed folder.)"""
    before = {cls: set(vars(cls)['_instance_dict']) for cls in _managers()}
    yield
    for cls in _managers():
        table = vars(cls)['_instance_dict']
        for key in [k for k in table if k not in before.get(cls, ())]:
            del table[key]


def analysis_tool(name: str):
    """tools/analysis/<name>.py as a module (its functions called in this process), without
    touching sys.path."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        f'{name}_tool', os.path.join(ROOT, 'tools', 'analysis', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_in_process(monkeypatch, script: str, *args) -> int:
    """``python script args`` in this process (the script's ``__main__`` block; its ``sys.argv``,
    ``sys.path`` and environment variables given back after): for tests where a tool's start in a
    new process is not what is tested (another test starts it). Returns its exit status."""
    import runpy
    # the launcher variables the tools set (tools/train.py: LOCAL_RANK) are gone after, as a new
    # process's would be: setenv first, so that monkeypatch records the value to give back
    for key in ('LOCAL_RANK', 'RANK', 'WORLD_SIZE'):
        monkeypatch.setenv(key, '')
        monkeypatch.delenv(key)
    # the tools restart themselves on tcmalloc where the system has it (setup_cpu_malloc): here
    # that would restart the test process
    monkeypatch.setenv('DEEPVIT_MALLOC', 'glibc')
    # mmengine's named instances (loggers, message hubs, visualizers) as a new process has them,
    # and the test's given back after: the configs name their visualizer 'visualizer', and an
    # earlier run's (with that run's backends) would otherwise be taken
    from collections import OrderedDict
    for cls in _managers():
        monkeypatch.setattr(cls, '_instance_dict', OrderedDict())
    monkeypatch.setattr(sys, 'argv', [script, *map(str, args)])
    monkeypatch.setattr(sys, 'path', list(sys.path))
    # the tools freeze what their process holds once the runner is built (gc.freeze): here it would
    # be the test process's objects, kept from every later collection
    frozen = gc.get_freeze_count()
    try:
        runpy.run_path(script, run_name='__main__')
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)  # as the interpreter prints sys.exit(message)
        return 1
    finally:
        if not frozen:
            gc.unfreeze()
    return 0


@pytest.fixture
def in_process(monkeypatch, capsys):
    """``in_process(script, *args, cwd=...)``: ``run_in_process`` with what the script printed, as
    ``subprocess.run`` returns it (a ``CompletedProcess``); an exception it raises ends it as it
    would end the process: its traceback on stderr, exit status 1."""
    import subprocess
    import traceback

    def run(script, *args, cwd):
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        try:
            code = run_in_process(monkeypatch, script, *args)
        except Exception:
            traceback.print_exc()
            code = 1
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess([script, *args], code, out, err)
    return run


@pytest.fixture
def logged(monkeypatch):
    """Messages given to mmengine's ``print_log`` (WARNING and above marked with their level)."""
    import logging

    import mmengine.logging
    import mmengine.runner.checkpoint
    messages, original = [], mmengine.logging.print_log

    def spy(msg, logger=None, level=logging.INFO):
        messages.append(str(msg) + (f' (level {level})' if level >= logging.WARNING else ''))
        return original(msg, logger=logger, level=level)
    monkeypatch.setattr(mmengine.logging, 'print_log', spy)
    monkeypatch.setattr(mmengine.runner.checkpoint, 'print_log', spy)
    return messages


# ------------------------------------------------------------------------------ model builders
def build_model(cfg, *, pretrained: bool = False, device=None) -> torch.nn.Module:
    """A config's whole detector or segmentor on CPU, as ``deepvit_mm.apis.build_from_config``
    builds it: mmdet's or mmseg's ``MODELS`` by the config's ``default_scope``, under that scope
    only, SyncBN reverted to BN (as mmengine's Runner does in one process), ``init_weights()`` run.

    Args:
        cfg (Config): A loaded config (not modified).
        pretrained (bool): Keep the backbone's ``init_cfg`` (a weights file, loaded by
            ``init_weights``). Default: False (dropped: the tests have no weights files; so is
            mmseg's ``model.pretrained``).
        device (str, optional): ``'meta'``: the structure only, no memory, no ``init_weights``.
            Default: None (the CPU).
    """
    from deepvit_mm.apis import build_from_config
    cfg = copy.deepcopy(cfg)
    if not pretrained:
        cfg.model.backbone.init_cfg = None
        if 'pretrained' in cfg.model:
            cfg.model.pretrained = None
    return build_from_config(cfg, device=device)[0]


def stock_config(name: str) -> str:
    """The file of ``'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'`` (or ``mmseg::``) in the
    installed package, found without ``pkg_resources``: mmengine 0.10 resolves ``mmdet::`` through
    it, which setuptools 82 removed (tests/configs/test_upstream.py checks both give one file)."""
    import importlib.util
    package, _, path = name.partition('::')
    root = os.path.dirname(importlib.util.find_spec(package).origin)
    return os.path.join(root, '.mim', 'configs', path)


def config_from_text(tmp_path, text: str):
    """A config written inline (indented text is dedented), read by mmengine from a file. Its
    ``'mmdet::...'`` / ``'mmseg::...'`` bases are read from the installed package's files
    (``stock_config``), so that a user's config is tested with or without ``pkg_resources``."""
    import re

    from mmengine.config import Config
    path = tmp_path / 'cfg.py'
    text = re.sub(r"'(mm(?:det|seg)::[^']+)'", lambda m: repr(stock_config(m.group(1))),
                  textwrap.dedent(text))
    path.write_text(text)
    return Config.fromfile(str(path))


# ------------------------------------------------------------------------------ tiny data
def seg_inputs(batch: int = 2, h: int = 64, w: int = 96, num_classes: int = 150) -> dict:
    """A segmentation batch as mmseg's data loader gives it (the harness's synthetic data): uint8
    images, random label maps."""
    from deepvit_tools.benchmark.batches import synthetic_data
    return synthetic_data('seg', (h, w), batch=batch, num_classes=num_classes)


def finite_loss_and_grads(model: torch.nn.Module, data: dict) -> dict:
    """One training step of a built detector/segmentor: the loss is finite and every trainable
    backbone parameter gets a finite gradient. Returns the logged losses."""
    model.train()
    data = model.data_preprocessor(data, True)
    loss, log_vars = model.parse_losses(model(**data, mode='loss'))
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.backbone.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    return log_vars


@pytest.fixture(scope='session')
def shapes(tmp_path_factory) -> str:
    """The COCO-format shapes demo dataset (16 train, 2 val images of 128 px), made once."""
    from deepvit_tools.demo_data import make_shapes_coco
    root = str(tmp_path_factory.mktemp('shapes'))
    make_shapes_coco(root, num_train=16, num_val=2, size=128, seed=0)
    return root


def randomize_(module: torch.nn.Module) -> torch.nn.Module:
    """Non-trivial BatchNorm statistics and LayerScale (XCiT's ``gamma1/2/3``, CaiT's and BEiT's
    ``gamma_1/2``, ViT's ``ls1/2.gamma``), in place: CaiT's and deep XCiTs' LayerScale starts at
    1e-5 or 1e-6, where a residual branch vanishes under a 1e-5 tolerance."""
    with torch.no_grad():
        for mod in module.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 1.5)
        for n, p in module.named_parameters():
            if n.endswith(('gamma1', 'gamma2', 'gamma3', 'gamma_1', 'gamma_2', '.gamma')):
                p.uniform_(0.2, 0.6)
    return module


def official_xcit_state_dict(timm_model: torch.nn.Module) -> dict:
    """A timm XCiT's weights in the official release layout: ``{'model': ...}``, ``pos_embeder``,
    class-attention ``qkv`` fused (timm splits them into q, k, v)."""
    sd = {}
    for k, v in timm_model.state_dict().items():
        sd[k.replace('pos_embed.', 'pos_embeder.')] = v.clone()
    for i in range(len(timm_model.cls_attn_blocks)):
        p = f'cls_attn_blocks.{i}.attn.'
        sd[p + 'qkv.weight'] = torch.cat([sd.pop(p + f'{n}.weight') for n in 'qkv'])
        sd[p + 'qkv.bias'] = torch.cat([sd.pop(p + f'{n}.bias') for n in 'qkv'])
    return {'model': sd, 'epoch': 400}


# ------------------------------------------------------------------------------ network
@contextlib.contextmanager
def serve(www):
    """An HTTP server on 127.0.0.1 serving the folder ``www``: yields its URL, the paths of the
    requests it answers, and ``cut``: ``cut[name] = n`` makes the next GET of ``name`` announce
    the whole length, send ``n`` bytes and close the connection (a transfer that ends short);
    ``cut[name] = (n, event)`` sends ``n`` bytes and holds the connection until ``event`` is set
    (a transfer in progress); ``cut[name] = [status, ...]`` answers the next GETs with those HTTP
    error statuses, one each (a failing server)."""
    hits, cut = [], {}

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(www), **k)

        def do_GET(self):
            hits.append(self.path)
            name = self.path.lstrip('/')
            if name not in cut:
                return super().do_GET()
            if isinstance(cut[name], list):
                status = cut[name].pop(0)
                if not cut[name]:
                    del cut[name]
                return self.send_error(status)
            data = (www / name).read_bytes()
            n, held = cut.pop(name), None
            if isinstance(n, tuple):
                n, held = n
            self.send_response(200)
            self.send_header('Content-Length', str(len(data)))
            self.end_headers()
            self.wfile.write(data[:n])
            self.wfile.flush()
            if held is not None:
                held.wait(120)
            self.close_connection = True

        def log_message(self, *a):
            pass
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    # polled every 10 ms for shutdown (the default 0.5 s was most of a download test's time)
    thread = threading.Thread(target=httpd.serve_forever, kwargs=dict(poll_interval=0.01),
                              daemon=True)
    thread.start()
    try:
        yield f'http://127.0.0.1:{httpd.server_address[1]}', hits, cut
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def server(tmp_path):
    """``serve`` over ``tmp_path/www``: yields the folder, the URL and the requests' paths."""
    www = tmp_path / 'www'
    www.mkdir()
    with serve(www) as (url, hits, _):
        yield www, url, hits


@pytest.fixture
def hub_dir(tmp_path, monkeypatch):
    """torch hub's folder moved under ``tmp_path`` for the test: its ``checkpoints`` folder."""
    monkeypatch.setattr(torch.hub, '_hub_dir', str(tmp_path / 'hub'))  # restored after the test
    return tmp_path / 'hub' / 'checkpoints'
