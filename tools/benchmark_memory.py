"""Peak memory and time of one forward + backward of a CaiT backbone, global vs windowed attention.

Every variant runs in a fresh Python process, so that its peak is its own:

* CPU: the process's peak resident set size, ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (Linux:
  KiB), read after the timed passes; "model + input" is the same reading taken after building the
  backbone and the input, so the difference is what forward + backward added (activations kept
  for backward, gradients, attention maps). (``tracemalloc`` does not see tensor memory.)
* Tensor memory, on any device: the first pass runs under ``torch.profiler`` with
  ``profile_memory=True``; the peak of its allocations minus frees, in time order, is what the
  pass allocated on top of the model and the input (what a GPU's allocator would have to hold;
  RSS also counts heap fragmentation and library buffers). The profiler's overhead is small
  next to these passes; use ``--warmup 1`` to keep the timed pass unprofiled.
* CUDA: ``torch.cuda.max_memory_allocated`` (tensor memory, without the caching allocator's slack).

An address-space cap (``--mem-limit-gb``, ``RLIMIT_AS``, CPU only) stops a variant that does not fit
instead of swapping the machine or waking the OOM killer: torch's allocator raises "can't allocate
memory" (reported as out of memory), or, when the allocation fails inside the profiler, the
process dies (reported as "failed (exit -11)"). The address space also holds ~3 GiB of library
mappings, so the cap must be that much above the expected peak RSS.

Time is the wall time of forward + backward of ``sum(mean(out ** 2))`` over the pyramid outputs,
after ``--warmup`` untimed passes, and the process's CPU time over the same pass
(``time.process_time``; with ``--threads 1`` it is the compute time even on a machine shared with
other jobs, where wall time mostly measures the wait); drop path is off so every pass does the
same work.

When the full depth does not fit, ``--out-indices`` (taps on earlier blocks prune the trunk) and
``--global-blocks`` measure what one more global or windowed block costs: e.g. 4 blocks with 1 or
2 of them global, and 8 blocks with 1 global, give the per-block costs of both kinds, from which
the full model's peak and time follow (memory and time are linear in the number of blocks of each
kind; check the fit on one more pruned run).

    python tools/benchmark_memory.py --arch s24 --size 800 1344
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = ('global', 'global+cp', 'window', 'window+cp')


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--arch', default='s24', help='CaiT arch (default: s24)')
    p.add_argument('--size', nargs=2, type=int, default=(800, 1344), metavar=('H', 'W'))
    p.add_argument('--batch', type=int, default=1)
    p.add_argument('--variants', nargs='+', choices=VARIANTS, default=list(VARIANTS),
                   help='global / windowed attention, with or without gradient checkpointing')
    p.add_argument('--window-size', type=int, default=14, help='patches per window side')
    p.add_argument('--out-indices', nargs=4, type=int, help='taps (default: the arch\'s own)')
    p.add_argument('--global-blocks', nargs='+', type=int,
                   help='blocks kept global in the windowed variants (default: the taps)')
    p.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    p.add_argument('--threads', type=int, help='torch CPU threads (default: torch\'s)')
    p.add_argument('--warmup', type=int, default=1, help='untimed passes first')
    p.add_argument('--repeat', type=int, default=1, help='timed passes (the median is reported)')
    p.add_argument('--mem-limit-gb', type=float, default=16.0,
                   help='CPU address-space cap per variant; 0: none')
    p.add_argument('--json', help='also write the results to this file')
    p.add_argument('--worker', choices=VARIANTS, help=argparse.SUPPRESS)  # one variant, in a child
    return p.parse_args()


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def _allocation_peak(prof) -> int:
    """Peak bytes allocated (allocations minus frees, in time order) during a profiled pass."""
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == '[memory]'),
                    key=lambda e: e.start_ns())
    current = peak = 0
    for e in events:
        current += e.nbytes()
        peak = max(peak, current)
    return peak


def run_variant(args) -> dict:
    """Build the backbone for ``args.worker`` and time forward + backward (in a fresh process)."""
    if args.device == 'cpu' and args.mem_limit_gb > 0:
        cap = int(args.mem_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    import torch

    from deepvit_mm import CaiT
    if args.threads:
        torch.set_num_threads(args.threads)
    variant = args.worker
    windowed = variant.startswith('window')
    model = CaiT(args.arch, window_size=args.window_size if windowed else 0,
                 global_blocks=args.global_blocks if windowed else None,
                 with_cp=variant.endswith('+cp'), drop_path_rate=0.0,
                 out_indices=args.out_indices).to(args.device).train()
    x = torch.randn(args.batch, 3, *args.size, device=args.device)
    result = dict(variant=variant, arch=args.arch, size=list(args.size), batch=args.batch,
                  window_size=model.window_size, global_blocks=list(model.global_blocks),
                  blocks=len(model.trunk.blocks), with_cp=model.with_cp, device=args.device,
                  threads=torch.get_num_threads(), tokens=(args.size[0] // 16) * (args.size[1] // 16))
    sync = torch.cuda.synchronize if args.device == 'cuda' else (lambda: None)
    if args.device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**30
    else:
        base = _rss_gb()
    times, tensor_peak = [], None
    try:
        for i in range(args.warmup + args.repeat):
            prof = torch.profiler.profile(profile_memory=True) if i == 0 else None
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            if prof is not None:
                prof.start()
            outs = model(x)
            loss = sum(o.float().pow(2).mean() for o in outs)
            loss.backward()
            sync()
            if prof is not None:
                prof.stop()
                tensor_peak = _allocation_peak(prof)
            if i >= args.warmup:
                times.append((time.perf_counter() - t0, time.process_time() - c0))
            del outs, loss
            model.zero_grad(set_to_none=False)  # gradients stay allocated, as in training
        result['status'] = 'ok'
    except (RuntimeError, MemoryError) as e:  # torch's allocator: "can't allocate memory"
        msg = str(e)
        if 'memory' not in msg.lower():
            raise
        result['status'] = 'out of memory: ' + msg.strip().splitlines()[-1][:160]
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == 'cuda' else _rss_gb()
    result.update(base_gb=round(base, 2), peak_gb=round(peak, 2), added_gb=round(peak - base, 2),
                  tensor_peak_gb=None if tensor_peak is None else round(tensor_peak / 2**30, 2),
                  seconds=round(sorted(times)[len(times) // 2][0], 2) if times else None,
                  cpu_seconds=round(sorted(times)[len(times) // 2][1], 2) if times else None,
                  all_seconds=[round(t, 2) for t, _ in times])
    return result


def main():
    args = parse_args()
    if args.worker:
        print(json.dumps(run_variant(args)))
        return
    rows = []
    for v in args.variants:
        cmd = [sys.executable, os.path.abspath(__file__), '--worker', v, *sys.argv[1:]]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{')]
        if proc.returncode or not lines:
            row = dict(variant=v, status=f'failed (exit {proc.returncode}): '
                                         f'{proc.stderr.strip().splitlines()[-1:] or ""}')
        else:
            row = json.loads(lines[-1])
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    unit = 'CUDA max allocated' if args.device == 'cuda' else 'peak RSS'
    print(f'\nCaiT-{args.arch}, {args.batch}x3x{args.size[0]}x{args.size[1]}, forward + backward, '
          f'{args.device}' + (f', {rows[0].get("threads")} threads' if args.device == 'cpu' else ''))
    print(f'| variant | global blocks | blocks | {unit} (GiB) | model + input (GiB) | added (GiB) '
          f'| tensor peak (GiB) | time (s) | CPU time (s) | status |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    for r in rows:
        gb = r.get('global_blocks')
        gb = 'all' if gb and len(gb) == r.get('blocks') else ', '.join(map(str, gb or []))
        print(f'| {r["variant"]} | {gb} | {r.get("blocks", "")} | {r.get("peak_gb", "")} '
              f'| {r.get("base_gb", "")} | {r.get("added_gb", "")} | {r.get("tensor_peak_gb", "")} '
              f'| {r.get("seconds", "")} | {r.get("cpu_seconds", "")} '
              f'| {r["status"]} |')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=1)


if __name__ == '__main__':
    main()
