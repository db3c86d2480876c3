"""Per-process memory of training on several processes: DDP against FSDP (configs/_base_/fsdp.py).

Trains a config for a few steps twice with tools/dist_train.sh, once as it is (DDP) and once with
configs/_base_/fsdp.py added, and reports for each process the model state it holds (weights,
gradients, optimizer state: counted from its tensors) and its peak resident set, and the FSDP / DDP
ratios. The default is the demo detector with CaiT-M36 (271M parameters) on the embedded shapes
data at 256x256, where the model state is most of the memory:

    python tools/analysis/benchmark_sharding.py                       # CaiT-M36, 2 processes
    python tools/analysis/benchmark_sharding.py --arch large_24_p16 --type XCiT

On a machine without CUDA the processes run on CPU with gloo (torch >= 2.13 for FSDP); each is
given --threads threads. What each number is: deepvit_tools/benchmark/sharding.py.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
DEMO = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_cait_xxs24_shapes.py')
FSDP = os.path.join(ROOT, 'configs', '_base_', 'fsdp.py')
MIB = 2 ** 20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--config', default=DEMO, help='a detection or segmentation config (default: '
                   'the CaiT demo detector)')
    p.add_argument('--type', default='CaiT', choices=['CaiT', 'XCiT'], help='backbone family')
    p.add_argument('--arch', default='m36', help='backbone arch (default: m36)')
    p.add_argument('--nproc', type=int, default=2, help='processes (default: 2)')
    p.add_argument('--iters', type=int, default=3, help='training steps (default: 3)')
    p.add_argument('--threads', type=int, default=1, help='threads per process (default: 1)')
    p.add_argument('--data', default=None, help='the shapes dataset (default: made in a temp dir)')
    p.add_argument('--work-dir', default=None, help='where the runs go (default: a temp dir)')
    return p.parse_args()


def run(args, sharded: bool, work: str, data: str) -> list:
    from deepvit_mm import CaiT, XCiT
    family = dict(CaiT=CaiT, XCiT=XCiT)[args.type]
    embed = family.arch_zoo[family.resolve_arch(args.arch)].embed_dim
    cfg = os.path.join(work, 'cfg.py')
    bases = [os.path.abspath(args.config)] + ([FSDP] if sharded else [])
    with open(cfg, 'w') as f:
        f.write(textwrap.dedent(f"""
            _base_ = {bases!r}
            custom_imports = dict(imports=['deepvit_mm', 'deepvit_tools.benchmark.sharding'],
                                  allow_failed_imports=False)
            model = dict(backbone=dict(_delete_=True, type={args.type!r}, arch={args.arch!r},
                                       norm_cfg=dict(type='BN', requires_grad=True),
                                       init_cfg=None),
                         neck=dict(in_channels=[{embed}] * 4))
            custom_hooks = [dict(type='ModelStateMemoryHook')]
            """))
    options = [f'train_dataloader.dataset.data_root={data}/', 'train_dataloader.num_workers=0',
               'train_dataloader.persistent_workers=False', f'train_cfg.max_iters={args.iters}',
               'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None',
               'param_scheduler.0.end=1', 'param_scheduler.1.begin=1',
               f'param_scheduler.1.end={args.iters}', 'default_hooks.logger.interval=1',
               'default_hooks.checkpoint.interval=100000', 'default_hooks.checkpoint.save_last=False']
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONWARNINGS='ignore',
               PORT=str(29500 + os.getpid() % 1000 + int(sharded)),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get('PATH', ''))
    out = subprocess.run(['bash', os.path.join(ROOT, 'tools', 'dist_train.sh'), cfg,
                          str(args.nproc), '--work-dir', work, '--cfg-options', *options],
                         env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f'{"FSDP" if sharded else "DDP"} run failed:\n{(out.stdout + out.stderr)[-4000:]}')
    return [json.load(open(os.path.join(work, f'memory_rank{r}.json')))
            for r in range(args.nproc)]


def main():
    args = parse_args()
    top = args.work_dir or tempfile.mkdtemp(prefix='benchmark_sharding_')
    data = args.data or os.path.join(top, 'shapes')
    if not os.path.isdir(data):
        from deepvit_tools.demo_data import make_shapes_coco
        make_shapes_coco(data, num_train=8, num_val=2)
    rows = {}
    for sharded in (False, True):
        work = os.path.join(top, 'fsdp' if sharded else 'ddp')
        os.makedirs(work, exist_ok=True)
        rows['FSDP' if sharded else 'DDP'] = run(args, sharded, work, data)
    print(f'\n{args.type}-{args.arch}, {args.nproc} processes, {args.iters} steps, '
          f'{args.threads} thread(s) each; MiB per process (rank 0; max over ranks):\n')
    print('| strategy | weights | gradients | optimizer state | model state | peak resident set |')
    print('|---|---|---|---|---|---|')
    def cell(ranks, key):
        return f'{ranks[0][key] / MIB:.0f}; {max(r[key] for r in ranks) / MIB:.0f}'

    for name, ranks in rows.items():
        for r in ranks:
            r['state'] = r['weights'] + r['grads'] + r['optimizer']
        print(f'| {name} | ' + ' | '.join(cell(ranks, k) for k in (
            'weights', 'grads', 'optimizer', 'state', 'peak_rss')) + ' |')
    ddp, fsdp = rows['DDP'], rows['FSDP']
    print(f'\nFSDP / DDP (max over ranks): model state '
          f'{max(r["state"] for r in fsdp) / max(r["state"] for r in ddp):.3f}, peak resident set '
          f'{max(r["peak_rss"] for r in fsdp) / max(r["peak_rss"] for r in ddp):.3f}')
    print(f'runs in {top}')


if __name__ == '__main__':
    main()
