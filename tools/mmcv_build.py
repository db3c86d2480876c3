"""mmcv 2.1.0 built from source for the torch at hand: what tools/setup_env.sh mends in its
``setup.py`` before building, what it gives a CUDA build, and the check of its compiled ops after.

    python tools/mmcv_build.py mend path/to/mmcv-2.1.0/setup.py   # before `pip wheel` of that folder
    python tools/mmcv_build.py cuda-plan                # export lines: a CUDA build's arch, or none
    python tools/mmcv_build.py cuda-toolkit --prefix D  # export lines: nvcc, headers (D: registry's)
    python tools/mmcv_build.py cuda-built               # exit 1 unless mmcv's ops have torch's CUDA
    python tools/mmcv_build.py check [--cuda-arch 9.0]  # nms and RoIAlign, forward and backward

Two things stop mmcv 2.1.0's ``setup.py`` as released:

* Python 3.13: ``get_version`` reads ``__version__`` from ``locals()`` after an ``exec``, which PEP
  667 no longer fills (``KeyError: '__version__'``): it is read from the ``exec``'s own namespace.
* torch 2.14 and newer: their headers stop any C++ standard below 20 (``#error C++20 or later
  compatible compiler is required to use ATen``), and mmcv passes ``-std=c++17`` (to g++ and nvcc)
  after any ``CXXFLAGS``: the flag is raised to ``-std=c++20`` (mmcv's sources compile unchanged).

mmcv compiles its CUDA ops where torch sees a GPU, or with ``FORCE_CUDA=1``. torch from the
registry is a CUDA build that brings the CUDA libraries and their headers (its ``nvidia`` wheels)
but no compiler, and its headers include headers (``cusparse.h``) that a partial CUDA toolkit
lacks. A CUDA build here gets:

* ``nvcc``: the first of ``$CUDA_HOME``, ``$CUDA_PATH``, the ``PATH``'s and ``/usr/local/cuda``'s
  whose CUDA major.minor is torch's (``torch.version.cuda``); else the registry's compiler of that
  CUDA (``REGISTRY_TOOLKIT``), installed for the build only into a folder of its own;
* torch's own CUDA headers (``site-packages/nvidia/*/include``) on ``CPATH``;
* ``TORCH_CUDA_ARCH_LIST``: ``MMCV_CUDA_ARCH`` or ``TORCH_CUDA_ARCH_LIST`` where set, else the
  visible GPUs' compute capabilities, else ``DEFAULT_ARCH`` (the H100 and H200). A wheel holds
  device code for those archs only: built for 9.0, its ops do not run on an 8.0 GPU.
"""
import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from packaging.version import Version

GET_VERSION = ("        exec(compile(f.read(), version_file, 'exec'))\n"
               "    return locals()['__version__']")
GET_VERSION_MENDED = ("        ns = {}\n"
                      "        exec(compile(f.read(), version_file, 'exec'), ns)\n"
                      "    return ns['__version__']")
#: the first torch whose headers need C++20
CXX20_TORCH = Version('2.14')


def needs_cxx20(torch_version: str) -> bool:
    """Whether torch ``torch_version`` (``'2.14.1+cu130'``, ``'2.16.0.dev20270101'``) needs C++20."""
    return Version(Version(torch_version).base_version) >= CXX20_TORCH


def mend(text: str, torch_version: str) -> str:
    """mmcv 2.1.0's ``setup.py`` text, mended to build on this Python against ``torch_version``.

    Raises:
        ValueError: the text is not the ``setup.py`` these mends were made for.
    """
    if GET_VERSION not in text and GET_VERSION_MENDED not in text:
        raise ValueError("mmcv's get_version is not the one this script mends: is this mmcv "
                         "2.1.0's setup.py?")
    text = text.replace(GET_VERSION, GET_VERSION_MENDED)
    if needs_cxx20(torch_version):
        if "'-std=c++17'" not in text and "'-std=c++20'" not in text:
            raise ValueError(f'no -std=c++17 to raise to C++20 for torch {torch_version}: is this '
                             "mmcv 2.1.0's setup.py?")
        text = text.replace("'-std=c++17'", "'-std=c++20'")
    return text


#: The registry's CUDA compiler, by CUDA major, each pinned to torch's major.minor: nvcc with the
#: headers and the device front end it needs beside it, and the runtime it links against. Their
#: files install under ``nvidia/cu<major>/``, a toolkit's layout (``bin/nvcc``, ``include``,
#: ``nvvm``, ``lib``).
REGISTRY_TOOLKIT = {
    13: ('nvidia-cuda-nvcc', 'nvidia-cuda-crt', 'nvidia-nvvm', 'nvidia-cuda-cccl',
         'nvidia-cuda-runtime'),
}
#: ``cuobjdump``, which lists the device code a wheel holds (any release of the CUDA major reads it)
REGISTRY_CUOBJDUMP = {13: 'nvidia-cuda-cuobjdump'}
#: The arch built where no GPU is visible and none is named: the H100's and H200's.
DEFAULT_ARCH = '9.0'
ARCH = re.compile(r'^\d+\.\d+(\+PTX)?$')
PREBUILT = ('or use the torch 2.1 stack, for which OpenMMLab publishes mmcv 2.1.0 with CUDA ops: '
            'make setup STACK=torch2.1, or pip install -U openmim "setuptools<82" && mim install '
            '"mmcv==2.1.0" beside torch 2.1.0 (docs/install.md#on-a-gpu)')


class CudaBuildError(RuntimeError):
    """A CUDA build that cannot be prepared here; its message is one line that says what to do."""


@dataclass(frozen=True)
class CudaBuild:
    """What a CUDA build of mmcv's ops is given.

    Attributes:
        cuda (str): torch's CUDA release, ``'13.0'``.
        arch (str): ``TORCH_CUDA_ARCH_LIST``, ``'9.0'`` or ``'8.0;9.0+PTX'``.
        arch_from (str): Where ``arch`` comes from, for the log.
        cuda_home (str | None): A toolkit whose nvcc is of ``cuda``; None: the registry's.
        registry (tuple[str, ...]): Requirements installed for the build (empty with ``cuda_home``).
        include (tuple[str, ...]): torch's own CUDA header folders, for ``CPATH``.
        notes (tuple[str, ...]): Lines for the log (an nvcc passed over, and why).
    """
    cuda: str
    arch: str
    arch_from: str
    cuda_home: Optional[str]
    registry: Tuple[str, ...]
    include: Tuple[str, ...]
    notes: Tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The wheel cache's key for the arch: ``'sm_90'``, ``'sm_80-sm_90+ptx'``."""
        return arch_key(self.arch)


def arch_parts(arch: str) -> List[str]:
    """``'8.0;9.0+PTX'`` or ``'8.0 9.0+PTX'`` -> ``['8.0', '9.0+PTX']``: an arch list's items."""
    return [a for a in re.split(r'[;\s]+', arch) if a]


def cuda_release(version: str) -> str:
    """``'13.0.88'`` or torch's ``'13.0'`` -> ``'13.0'``: a CUDA version's major.minor."""
    return '.'.join(version.split('.')[:2])


def registry_home(prefix: str, cuda: str) -> str:
    """Where the registry's CUDA wheels installed into ``prefix`` put their files, a toolkit's
    layout: ``prefix/nvidia/cu13`` for CUDA 13.x."""
    return os.path.join(prefix, 'nvidia', f'cu{cuda.split(".")[0]}')


def arch_key(arch: str) -> str:
    """``'9.0;8.0+PTX'`` -> ``'sm_80+ptx-sm_90'``: the archs sorted, for a folder name."""
    return '-'.join('sm_' + a.replace('.', '').replace('+PTX', '+ptx') for a in sorted(arch_parts(arch)))


def wants_cuda(torch_cuda: Optional[str], gpus: Sequence[Tuple[int, int]],
               env: Mapping[str, str]) -> bool:
    """Whether mmcv is to be built with CUDA ops: torch sees a GPU, or ``FORCE_CUDA=1``.

    Raises:
        CudaBuildError: ``FORCE_CUDA=1`` beside a torch built without CUDA.
    """
    forced = env.get('FORCE_CUDA', '0') == '1'
    if forced and not torch_cuda:
        raise CudaBuildError('FORCE_CUDA=1, but this torch is built without CUDA: install a CUDA '
                             'build of torch (pip install torch from the registry is one) and run '
                             'make setup again')
    return bool(torch_cuda) and (forced or bool(gpus))


def cuda_arch(gpus: Sequence[Tuple[int, int]], env: Mapping[str, str]) -> Tuple[str, str]:
    """``TORCH_CUDA_ARCH_LIST`` for the build and where it comes from.

    Raises:
        CudaBuildError: an arch named in a form torch does not take.
    """
    for var in ('MMCV_CUDA_ARCH', 'TORCH_CUDA_ARCH_LIST'):
        named = env.get(var, '').strip()
        if named:
            parts = arch_parts(named)
            bad = [a for a in parts if not ARCH.match(a)]
            if bad:
                raise CudaBuildError(f'{var}={named}: {bad[0]!r} is not a compute capability; name '
                                     f'them as major.minor, e.g. {var}=9.0 (H100/H200) or '
                                     f'{var}="8.0;9.0" (A100 and H100), +PTX for newer GPUs')
            return ';'.join(parts), var
    if gpus:
        caps = sorted(set(gpus))
        return ';'.join(f'{major}.{minor}' for major, minor in caps), 'the visible GPUs'
    return DEFAULT_ARCH, (f'no GPU visible and none named: {DEFAULT_ARCH} (H100/H200); '
                          'MMCV_CUDA_ARCH=8.0 builds for an A100')


def nvcc_release(version_output: str) -> Optional[str]:
    """``nvcc --version``'s CUDA release: ``'... release 13.0, V13.0.88'`` -> ``'13.0'``."""
    m = re.search(r'release (\d+\.\d+)', version_output)
    return m.group(1) if m else None


def nvcc_home(dryrun_output: str) -> Optional[str]:
    """The toolkit an nvcc belongs to, from ``nvcc --dryrun``'s ``_HERE_`` (its ``bin``): a
    wrapper script on the PATH (``/usr/local/bin/nvcc``) gives the real toolkit's folder."""
    m = re.search(r'^#\$ _HERE_=(.+)$', dryrun_output, re.MULTILINE)
    return os.path.dirname(m.group(1).strip()) if m else None


def nvcc_candidates(env: Mapping[str, str], which_nvcc: Optional[str]) -> List[str]:
    """The ``nvcc`` s a build could take, in order: ``$CUDA_HOME``'s, ``$CUDA_PATH``'s, the
    ``PATH``'s, ``/usr/local/cuda``'s."""
    homes = [env.get('CUDA_HOME'), env.get('CUDA_PATH')]
    found = [os.path.join(h, 'bin', 'nvcc') for h in homes if h]
    return found + ([which_nvcc] if which_nvcc else []) + ['/usr/local/cuda/bin/nvcc']


def plan_cuda_build(torch_cuda: str, gpus: Sequence[Tuple[int, int]], env: Mapping[str, str],
                    toolkits: Sequence[Tuple[str, Optional[str]]],
                    torch_headers: Sequence[str]) -> CudaBuild:
    """What a CUDA build of mmcv gets (the module's docstring says the rules).

    Args:
        torch_cuda: ``torch.version.cuda``.
        gpus: The visible GPUs' compute capabilities.
        env: The environment (``MMCV_CUDA_ARCH``, ``TORCH_CUDA_ARCH_LIST``).
        toolkits: ``(toolkit folder, its nvcc's CUDA release)`` of the nvccs found, in
            ``nvcc_candidates``' order.
        torch_headers: torch's own CUDA header folders.

    Raises:
        CudaBuildError: no nvcc of torch's CUDA here, and none the registry gives for it.
    """
    arch, arch_from = cuda_arch(gpus, env)
    want = cuda_release(torch_cuda)
    notes = []
    for home, release in toolkits:
        if release == want:
            return CudaBuild(want, arch, arch_from, home, (), tuple(torch_headers), tuple(notes))
        if release:
            notes.append(f'{home}/bin/nvcc is CUDA {release}, torch is built with CUDA {want}: '
                         'not used')
    major = int(want.split('.')[0])
    if major not in REGISTRY_TOOLKIT:
        raise CudaBuildError(
            f'no nvcc of CUDA {want} (torch {torch_cuda}) here, and the registry gives none this '
            f'set-up knows for CUDA {major}: install the CUDA {want} toolkit and set '
            f'CUDA_HOME to it (on a cluster: module load cuda/{want}), {PREBUILT}')
    registry = tuple(f'{pkg}=={want}.*' for pkg in REGISTRY_TOOLKIT[major])
    notes.append(f'no nvcc of CUDA {want} here: the registry\'s ({", ".join(registry)}) for this '
                 'build only')
    return CudaBuild(want, arch, arch_from, None, registry, tuple(torch_headers), tuple(notes))


def torch_cuda_headers() -> List[str]:
    """The include folders of torch's own CUDA wheels (``site-packages/nvidia/*/include``)."""
    import torch
    site = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    return sorted(glob.glob(os.path.join(site, 'nvidia', '*', 'include')))


def _visible_gpus() -> List[Tuple[int, int]]:
    import torch
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]


def probe_nvcc(nvcc: str) -> Optional[Tuple[str, str]]:
    """``(toolkit folder, CUDA release)`` of an ``nvcc``, or None where it does not run."""
    if not os.access(nvcc, os.X_OK):
        return None
    try:
        version = subprocess.run([nvcc, '--version'], capture_output=True, text=True, timeout=60)
        dryrun = subprocess.run([nvcc, '--dryrun', '-c', 'probe.cu'], capture_output=True,
                                text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    release, home = nvcc_release(version.stdout), nvcc_home(dryrun.stdout + dryrun.stderr)
    return (home, release) if release and home else None


def plan_here(env: Mapping[str, str] = os.environ) -> Optional[CudaBuild]:
    """This machine's CUDA build of mmcv, or None where mmcv is to be built for the CPU."""
    import torch
    gpus = _visible_gpus()
    if not wants_cuda(torch.version.cuda, gpus, env):
        return None
    toolkits, seen = [], set()
    for nvcc in nvcc_candidates(env, shutil.which('nvcc', path=env.get('PATH'))):
        found = probe_nvcc(nvcc)
        if found and os.path.realpath(found[0]) not in seen:
            seen.add(os.path.realpath(found[0]))
            toolkits.append(found)
    return plan_cuda_build(torch.version.cuda, gpus, env, toolkits, torch_cuda_headers())


def _pip_target(requirements: Sequence[str], prefix: str) -> None:
    """Install ``requirements`` (no dependencies) into ``prefix``, for this build only."""
    run = subprocess.run([sys.executable, '-m', 'pip', 'install', '--disable-pip-version-check',
                          '-q', '--no-deps', '--target', prefix, *requirements],
                         capture_output=True, text=True)
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ['(pip said nothing)'])[-1]
        raise CudaBuildError(f'pip could not install {" ".join(requirements)} ({last}): install '
                             f'the CUDA toolkit of torch\'s CUDA and set CUDA_HOME to it, {PREBUILT}')


def build_env(build: CudaBuild, prefix: str) -> Dict[str, str]:
    """The variables the build runs with; the registry's compiler installed into ``prefix``
    first where ``build`` needs it."""
    home = build.cuda_home
    if home is None:
        _pip_target(build.registry, prefix)
        home = registry_home(prefix, build.cuda)
        # torch links its extensions with -lcudart: the runtime wheel has only libcudart.so.<major>
        lib = os.path.join(home, 'lib')
        so = sorted(glob.glob(os.path.join(lib, 'libcudart.so.*')))
        if so and not os.path.exists(os.path.join(lib, 'libcudart.so')):
            os.symlink(os.path.basename(so[0]), os.path.join(lib, 'libcudart.so'))
    cpath = [p for p in [*build.include, os.environ.get('CPATH', '')] if p]
    return dict(FORCE_CUDA='1', TORCH_CUDA_ARCH_LIST=build.arch, CUDA_HOME=home,
                PATH=os.path.join(home, 'bin') + os.pathsep + os.environ.get('PATH', ''),
                CPATH=os.pathsep.join(cpath))


def device_archs(ext_path: str, cuobjdump: str) -> List[str]:
    """The archs a compiled library holds device code for, ``['sm_90']`` (``cuobjdump
    --list-elf``), PTX as ``'compute_90'`` (``--list-ptx``)."""
    found = set()
    for flag, pattern in (('--list-elf', r'\.(sm_\d+a?)\.cubin'), ('--list-ptx', r'\.(sm_\d+a?)\.ptx')):
        run = subprocess.run([cuobjdump, flag, ext_path], capture_output=True, text=True, timeout=600)
        if run.returncode != 0 and 'does not contain' not in run.stderr + run.stdout:
            raise RuntimeError(f'{cuobjdump} {flag} {ext_path}: {run.stderr.strip()}')
        for arch in re.findall(pattern, run.stdout):
            found.add(arch if flag == '--list-elf' else arch.replace('sm_', 'compute_'))
    return sorted(found)


def expected_archs(arch: str) -> List[str]:
    """``'8.0;9.0+PTX'`` -> ``['compute_90', 'sm_80', 'sm_90']``: what ``device_archs`` must list."""
    out = set()
    for a in arch_parts(arch):
        num = a.replace('+PTX', '').replace('.', '')
        out.add(f'sm_{num}')
        if a.endswith('+PTX'):
            out.add(f'compute_{num}')
    return sorted(out)


def find_cuobjdump(prefix: str, cuda: str) -> Optional[str]:
    """A ``cuobjdump``: on the PATH, else the registry's for CUDA ``cuda`` installed into
    ``prefix``; None where neither can be had."""
    found = shutil.which('cuobjdump')
    if found:
        return found
    major = int(cuda.split('.')[0])
    if major not in REGISTRY_CUOBJDUMP:
        return None
    try:
        _pip_target([f'{REGISTRY_CUOBJDUMP[major]}>={major}.0,<{major + 1}'], prefix)
    except CudaBuildError:
        return None
    path = os.path.join(registry_home(prefix, cuda), 'bin', 'cuobjdump')
    return path if os.access(path, os.X_OK) else None


def check_ops() -> None:
    """mmcv's compiled ``nms`` and ``RoIAlign`` run, forward and backward, and give what they
    must: the overlapping box dropped, a constant map's RoI features the constant, the gradient
    of their sum over the map the number of outputs (each output's bilinear weights sum to 1)."""
    import torch
    from mmcv.ops import RoIAlign, nms

    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [50., 50., 60., 60.]])
    _, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5)
    if keep.tolist() != [0, 2]:
        raise RuntimeError(f'mmcv.ops.nms kept boxes {keep.tolist()}, not [0, 2]')
    x = torch.full((1, 2, 16, 16), 3.0, requires_grad=True)
    rois = torch.tensor([[0., 2., 2., 12., 10.]])
    y = RoIAlign((2, 2), spatial_scale=1.0, sampling_ratio=2)(x, rois)
    if y.shape != (1, 2, 2, 2) or not torch.allclose(y, torch.full_like(y, 3.0)):
        raise RuntimeError(f'mmcv.ops.RoIAlign of a constant 3 map gave {y.flatten().tolist()}')
    y.sum().backward()
    if abs(x.grad.sum().item() - y.numel()) > 1e-4:
        raise RuntimeError(f'mmcv.ops.RoIAlign backward: gradient sum {x.grad.sum().item()}, '
                           f'not {y.numel()}')


def check_cuda_ops() -> None:
    """mmcv's ``nms`` and ``RoIAlign`` on the GPU give their CPU results, forward and backward."""
    import torch
    from mmcv.ops import RoIAlign, nms

    g = torch.Generator().manual_seed(0)
    xy = torch.rand(64, 2, generator=g) * 100
    boxes = torch.cat([xy, xy + 5 + torch.rand(64, 2, generator=g) * 30], 1)
    scores = torch.rand(64, generator=g)
    _, keep_cpu = nms(boxes, scores, iou_threshold=0.3)
    _, keep_gpu = nms(boxes.cuda(), scores.cuda(), iou_threshold=0.3)
    if keep_gpu.cpu().tolist() != keep_cpu.tolist():
        raise RuntimeError(f'mmcv.ops.nms on CUDA kept {keep_gpu.cpu().tolist()}, on the CPU '
                           f'{keep_cpu.tolist()}')
    x = torch.rand(2, 3, 32, 32, generator=g)
    rois = torch.tensor([[0., 1.5, 2., 20., 17.], [1., 4., 3.5, 30., 31.], [0., 0., 0., 8., 8.]])
    results = []
    for device in ('cpu', 'cuda'):
        xd = x.to(device).requires_grad_(True)
        y = RoIAlign((7, 7), spatial_scale=1.0, sampling_ratio=2)(xd, rois.to(device))
        (y * torch.arange(y.numel(), device=device).view_as(y)).sum().backward()
        results.append((y.detach().cpu(), xd.grad.cpu()))
    (y_cpu, g_cpu), (y_gpu, g_gpu) = results
    for name, a, b in (('forward', y_cpu, y_gpu), ('backward', g_cpu, g_gpu)):
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-4):
            raise RuntimeError(f'mmcv.ops.RoIAlign {name} on CUDA differs from the CPU by '
                               f'{(a - b).abs().max().item():.3g}')


def _torch_cuda() -> str:
    import torch
    return torch.version.cuda or ''


def compiled_cuda_problem() -> Optional[str]:
    """None if the installed mmcv's ops were compiled with torch's CUDA (major.minor), else what
    they were compiled with."""
    from mmcv.ops import get_compiling_cuda_version
    built, want = get_compiling_cuda_version(), cuda_release(_torch_cuda())
    return None if built == want else (f"mmcv's ops were compiled with CUDA {built!r}, not "
                                       f"torch's {want!r}")


def check_device_code(arch: str, prefix: str) -> str:
    """The installed mmcv's ``_ext`` holds device code for ``arch``; what it holds, for the log.

    Raises:
        RuntimeError: mmcv was built without CUDA, for another CUDA, or without code for ``arch``.
    """
    import mmcv
    problem = compiled_cuda_problem()
    if problem:
        raise RuntimeError(problem)
    cuda = cuda_release(_torch_cuda())  # what the ops were compiled with, checked above
    ext = glob.glob(os.path.join(os.path.dirname(mmcv.__file__), '_ext*.so'))
    if not ext:
        raise RuntimeError(f'no compiled _ext in {os.path.dirname(mmcv.__file__)}')
    cuobjdump = find_cuobjdump(prefix, cuda)
    if cuobjdump is None:
        return (f'CUDA {cuda}; its device code is not listed (no cuobjdump here, and the registry '
                f'has none for CUDA {cuda})')
    held = device_archs(ext[0], cuobjdump)
    missing = sorted(set(expected_archs(arch)) - set(held))
    if missing:
        raise RuntimeError(f'{os.path.basename(ext[0])} holds device code for {held or "no arch"}, '
                           f'not for {", ".join(missing)} (TORCH_CUDA_ARCH_LIST={arch})')
    return f'CUDA {cuda}, device code for {", ".join(held)}'


def _exports(values: Mapping[str, str]) -> str:
    return '\n'.join(f'export {k}={shlex.quote(v)}' for k, v in values.items())


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    m = sub.add_parser('mend', help="mend mmcv 2.1.0's setup.py in place for this Python and torch")
    m.add_argument('setup_py')
    sub.add_parser('cuda-plan', help='print export lines of a CUDA build (its arch and the wheel '
                                     'cache key), or nothing where mmcv is built for the CPU')
    t = sub.add_parser('cuda-toolkit', help="print export lines giving a CUDA build nvcc and torch's "
                                            "CUDA headers; the registry's nvcc goes into --prefix")
    t.add_argument('--prefix', required=True, help='folder for the registry\'s compiler, if needed')
    sub.add_parser('cuda-built', help="exit 1 unless the installed mmcv's ops were compiled with "
                                      "torch's CUDA")
    c = sub.add_parser('check', help="run mmcv's compiled nms and RoIAlign, forward and backward "
                                     '(on a GPU too where one is visible)')
    c.add_argument('--cuda-arch', help='a CUDA build: the TORCH_CUDA_ARCH_LIST its _ext must hold '
                                       'device code for (checked with cuobjdump where no GPU is '
                                       'visible)')
    c.add_argument('--prefix', help="folder for the registry's cuobjdump, if needed (default: a "
                                    'temporary one)')
    return parser.parse_args()


def _check(args) -> None:
    import tempfile

    import torch
    check_ops()
    print('[setup] mmcv ops: nms and RoIAlign forward and backward are right')
    if not args.cuda_arch:
        return
    if torch.cuda.is_available():
        check_cuda_ops()
        print(f'[setup] mmcv CUDA ops on {torch.cuda.get_device_name(0)}: nms and RoIAlign '
              'forward and backward give their CPU results')
    with tempfile.TemporaryDirectory() as tmp:
        held = check_device_code(args.cuda_arch, args.prefix or tmp)
    print(f'[setup] mmcv CUDA ops: {held}; TORCH_CUDA_ARCH_LIST={args.cuda_arch} (a wheel runs only '
          'on GPUs of the archs it was built for)')


def main():
    args = parse_args()
    if args.command == 'check':
        try:
            _check(args)
        except Exception as e:  # an import error of the compiled ops included: one line
            sys.exit(f'[setup] mmcv ops check failed: {type(e).__name__}: {e}')
        return
    if args.command == 'cuda-built':
        try:
            problem = compiled_cuda_problem()
        except Exception as e:  # mmcv's compiled ops do not import
            problem = f'{type(e).__name__}: {e}'
        sys.exit(1 if problem else 0)
    if args.command in ('cuda-plan', 'cuda-toolkit'):
        try:
            build = plan_here()
            if build is None:
                return
            if args.command == 'cuda-plan':
                for note in build.notes:
                    print(f'[setup] {note}', file=sys.stderr)
                print(f'[setup] CUDA build for TORCH_CUDA_ARCH_LIST={build.arch} ({build.arch_from})',
                      file=sys.stderr)
                print(_exports(dict(FORCE_CUDA='1', TORCH_CUDA_ARCH_LIST=build.arch,
                                    MMCV_ARCH_KEY=build.key)))
            else:
                print(_exports(build_env(build, os.path.abspath(args.prefix))))
        except CudaBuildError as e:
            print(f'[setup] {e}', file=sys.stderr)
            sys.exit(2)
        return
    import torch
    with open(args.setup_py, encoding='utf-8') as f:
        text = f.read()
    try:
        text = mend(text, torch.__version__)
    except ValueError as e:
        sys.exit(f'[setup] {args.setup_py}: {e}')
    with open(args.setup_py, 'w', encoding='utf-8') as f:
        f.write(text)


if __name__ == '__main__':
    main()
