"""Whether the suite already ran on the kernels of an AVX2-only CPU (``make test`` asks).

``make test`` runs the tests marked ``numerics`` a second time on torch's and oneDNN's AVX2 kernels
(``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``). Where the suite itself ran on them, that
second pass would run the same kernels again: on a CPU whose instructions stop at AVX2 (torch's
own choice is ``AVX2`` and the CPU has no AVX-512, AMX or AVX-VNNI for oneDNN to take), or where
both variables are already set so. ``python tests/kernels.py`` exits 0 and says why in that case,
1 where the second pass runs other kernels than the suite. It imports nothing but torch.
"""
import os
import sys

# CPU flags (/proc/cpuinfo) of instructions oneDNN uses above AVX2 ('avx512*', 'amx_*', AVX-VNNI
# and the AVX2-width bfloat16 / fp16 conversions of the newest Intel and AMD cores)
ABOVE_AVX2 = ('avx512', 'amx', 'avx_vnni', 'avx_ne_convert', 'avx_ifma', 'avx_vnni_int8')


def cpu_flags(path: str = '/proc/cpuinfo') -> set:
    """The first CPU's flags; empty where the file is not there (not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith('flags'):
                    return set(line.split(':', 1)[1].split())
    except OSError:
        pass
    return set()


def avx2_kernels_already(capability: str, flags: set, env: dict) -> str:
    """Why this process's kernels are already the AVX2 pass's (a sentence), or ``''`` where the
    pass would run others.

    Args:
        capability (str): ``torch.backends.cpu.get_cpu_capability()`` in this environment.
        flags (set): The CPU's flags (``cpu_flags()``); empty: unknown, the pass runs.
        env (dict): The environment the suite ran in.
    """
    if capability.upper() != 'AVX2' or not flags:
        return ''
    if env.get('ONEDNN_MAX_CPU_ISA', '').upper() == 'AVX2':
        return 'the suite ran with ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA at AVX2'
    if any(f.startswith(ABOVE_AVX2) for f in flags):
        return ''
    return "this CPU's instructions stop at AVX2 (no AVX-512, AMX or AVX-VNNI)"


def main() -> int:
    import torch
    why = avx2_kernels_already(torch.backends.cpu.get_cpu_capability(), cpu_flags(), os.environ)
    if why:
        print(f'[test] the tests marked numerics ran on the AVX2 kernels in the suite: {why}; '
              '`make test-avx2` runs them again')
        return 0
    return 1


if __name__ == '__main__':
    sys.exit(main())
