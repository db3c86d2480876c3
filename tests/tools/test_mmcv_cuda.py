"""What ``make setup`` decides for a CUDA build of mmcv's ops (tools/mmcv_build.py), on fakes of
each case: whether to build with CUDA, the nvcc taken (the machine's of torch's CUDA, else the
registry's), torch's own headers on the include path, the archs, the wheel's device code, and the
one line where it cannot be done. A real build takes ~28 minutes on 2 cores and is not run here."""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

CUDA13 = ('nvidia-cuda-nvcc==13.0.*', 'nvidia-cuda-crt==13.0.*', 'nvidia-nvvm==13.0.*',
          'nvidia-cuda-cccl==13.0.*', 'nvidia-cuda-runtime==13.0.*')
NVCC_VERSION = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release {release}, V{release}.88
Build cuda_{release}.r{release}/compiler.36424714_0
"""


@pytest.fixture(scope='module')
def mb():
    spec = importlib.util.spec_from_file_location('mmcv_build', os.path.join(ROOT, 'tools', 'mmcv_build.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize('torch_cuda,gpus,env,wanted', [
    (None, [], {}, False),                          # a CPU torch
    ('13.0', [], {}, False),                        # a CUDA torch, no GPU: the CPU ops
    ('13.0', [(9, 0)], {}, True),                   # a GPU visible
    ('13.0', [], {'FORCE_CUDA': '1'}, True),        # asked for
    ('12.1', [], {'FORCE_CUDA': '0'}, False),
])
def test_a_cuda_build_is_made_where_torch_sees_a_gpu_or_is_asked(mb, torch_cuda, gpus, env, wanted):
    assert mb.wants_cuda(torch_cuda, gpus, env) is wanted


def test_force_cuda_beside_a_cpu_torch_says_what_to_install(mb):
    with pytest.raises(mb.CudaBuildError, match='this torch is built without CUDA: install a CUDA '
                                                'build of torch'):
        mb.wants_cuda(None, [], {'FORCE_CUDA': '1'})


@pytest.mark.parametrize('gpus,env,arch,source', [
    ([(9, 0), (9, 0)], {}, '9.0', 'the visible GPUs'),
    ([(9, 0), (8, 0)], {}, '8.0;9.0', 'the visible GPUs'),
    ([(9, 0)], {'MMCV_CUDA_ARCH': '8.0'}, '8.0', 'MMCV_CUDA_ARCH'),
    ([], {'TORCH_CUDA_ARCH_LIST': '8.0 9.0+PTX'}, '8.0;9.0+PTX', 'TORCH_CUDA_ARCH_LIST'),
    ([], {'MMCV_CUDA_ARCH': '9.0', 'TORCH_CUDA_ARCH_LIST': '8.0'}, '9.0', 'MMCV_CUDA_ARCH'),
])
def test_the_arch_is_the_named_one_else_the_gpus(mb, gpus, env, arch, source):
    assert mb.cuda_arch(gpus, env) == (arch, source)


def test_without_a_gpu_or_a_name_the_arch_is_the_h100s_and_said(mb):
    arch, source = mb.cuda_arch([], {})
    assert arch == mb.DEFAULT_ARCH == '9.0'
    assert 'no GPU visible and none named' in source and 'MMCV_CUDA_ARCH=8.0' in source


@pytest.mark.parametrize('bad', ['sm_90', '9', 'hopper', '9.0;x'])
def test_an_arch_torch_does_not_take_is_refused_with_the_form_it_takes(mb, bad):
    with pytest.raises(mb.CudaBuildError, match=r'is not a compute capability; name them as '
                                                r'major\.minor, e\.g\. MMCV_CUDA_ARCH=9\.0'):
        mb.cuda_arch([], {'MMCV_CUDA_ARCH': bad})


@pytest.mark.parametrize('arch,key,listed', [
    ('9.0', 'sm_90', ['sm_90']),
    ('9.0;8.0', 'sm_80-sm_90', ['sm_80', 'sm_90']),
    ('8.0;9.0+PTX', 'sm_80-sm_90+ptx', ['compute_90', 'sm_80', 'sm_90']),
])
def test_the_cache_key_and_the_device_code_of_an_arch_list(mb, arch, key, listed):
    assert mb.arch_key(arch) == key
    assert mb.expected_archs(arch) == listed


def test_nvccs_version_and_toolkit_are_read_from_its_own_output(mb):
    assert mb.nvcc_release(NVCC_VERSION.format(release='13.0')) == '13.0'
    assert mb.nvcc_release('command not found') is None
    dryrun = '#$ _NVVM_BRANCH_=nvvm\n#$ _HERE_=/usr/local/cuda-13.0/bin\n#$ _THERE_=/x\n'
    assert mb.nvcc_home(dryrun) == '/usr/local/cuda-13.0'
    assert mb.nvcc_candidates({'CUDA_HOME': '/a', 'CUDA_PATH': '/b'}, '/usr/local/bin/nvcc') == [
        '/a/bin/nvcc', '/b/bin/nvcc', '/usr/local/bin/nvcc', '/usr/local/cuda/bin/nvcc']


def test_the_machines_nvcc_of_torchs_cuda_is_taken_with_torchs_headers(mb):
    toolkits = [('/opt/cuda-13.1', '13.1'), ('/usr/local/cuda-13.0', '13.0')]
    build = mb.plan_cuda_build('13.0', [(9, 0)], {}, toolkits, ['/site/nvidia/cu13/include'])
    assert build.cuda_home == '/usr/local/cuda-13.0' and build.registry == ()
    assert build.include == ('/site/nvidia/cu13/include',) and build.arch == '9.0'
    assert build.notes == ('/opt/cuda-13.1/bin/nvcc is CUDA 13.1, torch is built with CUDA 13.0: '
                           'not used',)


@pytest.mark.parametrize('toolkits', [[], [('/usr/local/cuda-13.1', '13.1')]], ids=['no-nvcc', 'other-minor'])
def test_without_a_matching_nvcc_the_registrys_of_torchs_cuda_is_installed_for_the_build(mb, toolkits):
    build = mb.plan_cuda_build('13.0', [], {'MMCV_CUDA_ARCH': '9.0'}, toolkits, ['/h'])
    assert build.cuda_home is None and build.registry == CUDA13
    assert "no nvcc of CUDA 13.0 here: the registry's" in build.notes[-1]


@pytest.mark.parametrize('toolkits', [[], [('/usr/local/cuda-12.4', '12.4')]])
def test_a_cuda_the_registry_route_does_not_know_gets_one_line_of_what_to_install(mb, toolkits):
    with pytest.raises(mb.CudaBuildError) as e:
        mb.plan_cuda_build('12.1', [(8, 0)], {}, toolkits, [])
    line = str(e.value)
    assert '\n' not in line and 'no nvcc of CUDA 12.1' in line
    assert ('install the CUDA 12.1 toolkit and set CUDA_HOME to it (on a cluster: module load '
            'cuda/12.1)') in line
    assert 'make setup STACK=torch2.1' in line and 'mim install "mmcv==2.1.0"' in line


def test_a_machines_nvcc_of_torchs_cuda_12_is_taken(mb):
    build = mb.plan_cuda_build('12.1', [(8, 0)], {}, [('/usr/local/cuda-12.1', '12.1')], [])
    assert build.cuda_home == '/usr/local/cuda-12.1' and build.arch == '8.0'


def test_the_registrys_compiler_is_laid_out_as_a_toolkit(mb, tmp_path, monkeypatch):
    """build_env installs the registry's packages into the prefix (here a fake pip that lays out
    their files), links libcudart.so for torch's -lcudart, and gives nvcc's folder first on PATH
    and torch's headers on CPATH."""
    installed = []

    def fake_pip(requirements, prefix):
        installed.extend(requirements)
        home = os.path.join(prefix, 'nvidia', 'cu13')
        for rel in ('bin/nvcc', 'lib/libcudart.so.13', 'include/cuda_runtime.h'):
            os.makedirs(os.path.dirname(os.path.join(home, rel)), exist_ok=True)
            open(os.path.join(home, rel), 'w').close()
    monkeypatch.setattr(mb, '_pip_target', fake_pip)
    monkeypatch.setenv('CPATH', '/mine')
    build = mb.plan_cuda_build('13.0', [], {}, [], ['/site/nvidia/cu13/include'])
    env = mb.build_env(build, str(tmp_path))
    home = str(tmp_path / 'nvidia' / 'cu13')
    assert installed == list(CUDA13)
    assert env['CUDA_HOME'] == home and env['PATH'].startswith(f'{home}/bin:')
    assert env['CPATH'] == '/site/nvidia/cu13/include:/mine'
    assert env['TORCH_CUDA_ARCH_LIST'] == '9.0' and env['FORCE_CUDA'] == '1'
    assert os.readlink(os.path.join(home, 'lib', 'libcudart.so')) == 'libcudart.so.13'


def test_a_registry_that_cannot_be_reached_gets_one_line(mb, tmp_path):
    """pip with an index that is not there: one line naming the toolkit to install instead."""
    env = dict(os.environ, PIP_INDEX_URL='http://127.0.0.1:9/simple', PIP_NO_INDEX='1',
               PIP_FIND_LINKS='', PIP_RETRIES='0', PIP_TIMEOUT='1')
    run = subprocess.run([sys.executable, '-c', 'import sys; sys.path.insert(0, sys.argv[1]); '
                          'import mmcv_build as m; m._pip_target(["nvidia-cuda-nvcc==13.0.*"], sys.argv[2])',
                          os.path.join(ROOT, 'tools'), str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert 'CudaBuildError: pip could not install nvidia-cuda-nvcc==13.0.*' in last
    assert 'set CUDA_HOME to it' in last and 'STACK=torch2.1' in last


def _fake_nvcc(folder, release):
    """A toolkit folder whose bin/nvcc answers --version and --dryrun as nvcc does."""
    os.makedirs(folder / 'bin')
    nvcc = folder / 'bin' / 'nvcc'
    nvcc.write_text('#!/bin/sh\ncase "$1" in\n'
                    f'  --version) cat <<EOF\n{NVCC_VERSION.format(release=release)}EOF\n;;\n'
                    f'  --dryrun) echo "#\\$ _HERE_={folder}/bin" >&2 ;;\nesac\n')
    nvcc.chmod(0o755)
    return folder


@pytest.mark.slow
def test_cuda_plan_on_this_torch_takes_cuda_home_of_its_cuda(tmp_path):
    """``mmcv_build.py cuda-plan`` / ``cuda-toolkit`` as the set-up runs them, with FORCE_CUDA=1
    and CUDA_HOME a fake toolkit of this torch's CUDA: the export lines the build gets. ~6 s of
    CPU: two interpreters that import torch."""
    if not torch.version.cuda:
        pytest.skip('a CPU build of torch')
    home = _fake_nvcc(tmp_path / 'cuda', torch.version.cuda)
    env = {k: v for k, v in os.environ.items() if k not in ('MMCV_CUDA_ARCH', 'TORCH_CUDA_ARCH_LIST')}
    env.update(FORCE_CUDA='1', CUDA_HOME=str(home), MMCV_CUDA_ARCH='8.0;9.0')
    tool = os.path.join(ROOT, 'tools', 'mmcv_build.py')
    plan = subprocess.run([sys.executable, tool, 'cuda-plan'], env=env, capture_output=True,
                          text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.splitlines() == ['export FORCE_CUDA=1', "export TORCH_CUDA_ARCH_LIST='8.0;9.0'",
                                       'export MMCV_ARCH_KEY=sm_80-sm_90']
    assert '[setup] CUDA build for TORCH_CUDA_ARCH_LIST=8.0;9.0 (MMCV_CUDA_ARCH)' in plan.stderr
    kit = subprocess.run([sys.executable, tool, 'cuda-toolkit', '--prefix', str(tmp_path / 'p')],
                         env=env, capture_output=True, text=True, timeout=300)
    assert kit.returncode == 0, kit.stderr
    assert f'export CUDA_HOME={home}' in kit.stdout.splitlines()
    assert not (tmp_path / 'p').exists()  # nothing installed: the machine's nvcc fits
    headers = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), 'nvidia')
    if os.path.isdir(headers):
        assert headers in kit.stdout  # torch's own CUDA headers on CPATH


def test_cuda_plan_without_cuda_asked_says_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != 'FORCE_CUDA'}
    env['CUDA_VISIBLE_DEVICES'] = ''
    run = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'mmcv_build.py'), 'cuda-plan'],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout == '' and run.stderr == '', run


def test_the_wheels_device_code_is_listed_and_a_missing_arch_fails(mb, tmp_path, monkeypatch):
    """check_device_code reads cuobjdump's lists (a fake cuobjdump here) against the archs asked."""
    cuobjdump = tmp_path / 'cuobjdump'
    cuobjdump.write_text('#!/bin/sh\ncase "$1" in\n'
                         '  --list-elf) echo "ELF file    1: _ext.1.sm_90.cubin"; '
                         'echo "ELF file    2: _ext.2.sm_90.cubin" ;;\n'
                         '  --list-ptx) echo "cuobjdump info    : File \'$2\' does not contain '
                         'device code" >&2; exit 1 ;;\nesac\n')
    cuobjdump.chmod(0o755)
    assert mb.device_archs('x.so', str(cuobjdump)) == ['sm_90']
    import mmcv.ops
    monkeypatch.setattr(mmcv.ops, 'get_compiling_cuda_version', lambda: torch.version.cuda or '13.0')
    monkeypatch.setattr(torch.version, 'cuda', torch.version.cuda or '13.0')
    monkeypatch.setattr(mb, 'find_cuobjdump', lambda prefix, cuda: str(cuobjdump))
    assert mb.check_device_code('9.0', str(tmp_path)).endswith('device code for sm_90')
    with pytest.raises(RuntimeError, match=r'holds device code for \[.sm_90.\], not for sm_80'):
        mb.check_device_code('8.0;9.0', str(tmp_path))
    monkeypatch.setattr(mmcv.ops, 'get_compiling_cuda_version', lambda: 'not available')
    with pytest.raises(RuntimeError, match="compiled with CUDA 'not available'"):
        mb.check_device_code('9.0', str(tmp_path))


def test_cuda_built_tells_an_mmcv_without_torchs_cuda():
    """``mmcv_build.py cuda-built``, the set-up's test of an installed mmcv: exit 0 only where
    its ops were compiled with torch's CUDA (the CPU build here: 1)."""
    from mmcv.ops import get_compiling_cuda_version
    run = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'mmcv_build.py'), 'cuda-built'],
                         capture_output=True, text=True, timeout=300)
    ok = get_compiling_cuda_version() == '.'.join((torch.version.cuda or '').split('.')[:2])
    assert run.returncode == (0 if ok else 1), run
