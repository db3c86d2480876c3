"""``compile_blocks``: every block's attention and MLP compiled in place by ``torch.compile``, with
dynamic sizes. Checked: the switch's arguments and the torch it needs, the state dict's keys (a
compiled run's checkpoint loads into an eager model and back), one compilation a part over a
recipe's whole multi-scale shape range, and the segmentation demo's loss and gradients compiled
as in eager."""
import math

import pytest
import torch
from conftest import CONFIG_DIR, DEMO_SEG, EARLY, build_model, seg_inputs

from deepvit_mm import CaiT, XCiT
from deepvit_mm.models.backbones import columnar
from deepvit_mm.models.backbones.checks import blocks_compile_problem
from deepvit_mm.models.backbones.xcit import fast

needs_inlining = pytest.mark.skipif(blocks_compile_problem() is not None,
                                    reason='this torch cannot compile the blocks (the refusal '
                                           'is tested)')


@pytest.mark.parametrize('value', [1, 'yes', ['max-autotune']])
def test_compile_blocks_takes_a_bool_or_torch_compile_options(value):
    with pytest.raises(TypeError, match='compile_blocks must be True, False or a dict'):
        XCiT.parse_args('nano_12_p16', compile_blocks=value)
    with pytest.raises(TypeError, match='no torch.compile option fullgraf'):
        XCiT.parse_args('nano_12_p16', compile_blocks=dict(fullgraf=True))
    assert XCiT.parse_args('nano_12_p16').compile_blocks is None
    assert XCiT.parse_args('nano_12_p16', compile_blocks=True).compile_blocks == {}
    assert XCiT.parse_args('nano_12_p16', compile_blocks=dict(mode='max-autotune')
                           ).compile_blocks == dict(mode='max-autotune')


def test_a_torch_that_cannot_compile_the_blocks_is_refused_at_build(monkeypatch):
    """Where dynamo does not inline modules (torch 2.1: each block's copy of a part its own
    graph), building with the switch on says so and what to do; elsewhere the refusal is made to
    happen."""
    if blocks_compile_problem() is None:
        monkeypatch.setattr(columnar, 'blocks_compile_problem', lambda: 'this torch cannot.')
    with pytest.raises(RuntimeError, match=r'XCiT: compile_blocks: .*(cannot|compile_blocks off)'):
        XCiT('nano_12_p16', out_indices=EARLY, compile_blocks=True)


@needs_inlining
def test_a_capped_isa_with_inductors_shared_cache_warns_at_build(monkeypatch, recwarn):
    """torch's kernels capped by ATEN_CPU_CAPABILITY while the compiled kernels go to inductor's
    shared cache, which does not tell instruction sets apart: building with the switch warns,
    naming the folder to set; with TORCHINDUCTOR_CACHE_DIR set, or no cap, it does not."""
    monkeypatch.setenv('ATEN_CPU_CAPABILITY', 'avx2')
    monkeypatch.delenv('TORCHINDUCTOR_CACHE_DIR')
    with pytest.warns(UserWarning, match=r'XCiT: compile_blocks: ATEN_CPU_CAPABILITY=avx2 .*'
                                         r'TORCHINDUCTOR_CACHE_DIR .*/tmp/torchinductor_avx2'):
        XCiT('nano_12_p16', out_indices=EARLY, compile_blocks=True)
    recwarn.clear()
    XCiT('nano_12_p16', out_indices=EARLY)  # not compiled: nothing to warn about
    monkeypatch.setenv('TORCHINDUCTOR_CACHE_DIR', '/tmp/torchinductor_avx2')
    XCiT('nano_12_p16', out_indices=EARLY, compile_blocks=True)
    monkeypatch.delenv('TORCHINDUCTOR_CACHE_DIR')
    for isa in ('', 'default'):
        monkeypatch.setenv('ATEN_CPU_CAPABILITY', isa)
        XCiT('nano_12_p16', out_indices=EARLY, compile_blocks=True)
    assert not [w for w in recwarn if 'TORCHINDUCTOR_CACHE_DIR' in str(w.message)]


@needs_inlining
@pytest.mark.parametrize('family,arch', [(XCiT, 'nano_12_p16'), (CaiT, 'xxs24')])
def test_compiled_in_place_keeps_the_state_dict_and_its_keys(family, arch):
    """Compiled in place, the modules stay where they were: a checkpoint of the compiled model
    loads strictly into an eager one and back. Nothing is compiled before a call (the first
    ``nn.Module.compile`` of a process sets dynamo up: ~1.5 s)."""
    eager = family(arch, out_indices=EARLY)
    compiled = family(arch, out_indices=EARLY, compile_blocks=True)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    parts = compiled._compiled_modules()  # attention and MLP; CaiT: the MLP (its chunk loop)
    assert len(parts) == (1 if family is CaiT else 2) * len(compiled.trunk.blocks)
    assert all(p._compiled_call_impl is not None for p in parts)
    assert all(getattr(m, '_compiled_call_impl', None) is None
               for m in compiled.modules() if all(m is not p for p in parts))
    eager.load_state_dict(compiled.state_dict(), strict=True)
    compiled.load_state_dict(eager.state_dict(), strict=True)


@needs_inlining
def test_xcit_auto_under_compile_is_its_own_rule():
    """``gram_xca='auto'`` with the blocks compiled: the rule measured for compiled blocks
    (``xca_block_forward_auto_compiled``); True and False as without compiling."""
    m = XCiT('nano_12_p16', out_indices=EARLY, compile_blocks=True)
    assert all(blk.forward.__func__ is fast.xca_block_forward_auto_compiled
               for blk in m.trunk.blocks)
    assert all(blk.forward.__func__ is fast.xca_block_forward_auto
               for blk in XCiT('nano_12_p16', out_indices=EARLY).trunk.blocks)
    m.gram_xca = True
    assert all(blk.forward.__func__ is fast.xca_block_forward for blk in m.trunk.blocks)
    m.gram_xca = False
    assert all('forward' not in blk.__dict__ for blk in m.trunk.blocks)


def _recipe_sizes(config: str):
    """The padded input sizes a multi-scale recipe trains at: every scale of its resizes (short
    side, long side at most; those before a crop too), landscape 4:3 and portrait 3:4 images and
    the longest allowed, each padded to the data preprocessor's divisor."""
    from mmengine.config import Config
    cfg = Config.fromfile(config)
    scales = set()

    def find(node):
        if isinstance(node, dict):
            if node.get('type') == 'RandomChoiceResize':
                scales.update(tuple(s) for s in node['scales'])
            for v in node.values():
                find(v)
        elif isinstance(node, (list, tuple)):
            for v in node:
                find(v)
    find(cfg.train_pipeline)
    div = cfg.model.data_preprocessor.pad_size_divisor
    sizes = set()
    for short, long in sorted(scales):
        for h, w in [(short, min(long, round(short * 4 / 3))), (min(long, round(short * 4 / 3)),
                                                                  short), (short, long)]:
            sizes.add((math.ceil(h / div) * div, math.ceil(w / div) * div))
    return sorted(sizes)


@needs_inlining
@pytest.mark.slow
def test_one_compilation_a_part_over_a_recipes_shapes():
    """Training steps (forward and backward, drop path on) at every 5th padded size of the Mask
    R-CNN 3x recipes' multi-scale training (short side 400-800, long side up to 1333: 40 sizes,
    from the smallest to the largest, landscape, portrait and the longest), the
    blocks compiled by dynamo and AOTAutograd as inductor gets them (``backend='aot_eager'``:
    the graphs and their guards without inductor's code generation), XCiT-N12/16 on its first 4
    blocks: at most 8 compilations in all (a part's graph each; XCiT's attention
    is compiled where it runs timm's forward, not on the CPU's large inputs, which take the
    faster forward). CaiT's compiled parts, its MLPs, have nothing that depends on the size.
    ~7 s: 9 steps at up to 800 x 1344."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    sizes = _recipe_sizes(f'{CONFIG_DIR}/mask_rcnn_xcit_s12_8_3x.py')
    assert len(sizes) > 30 and max(max(s) for s in sizes) == 1344
    torch._dynamo.reset()
    counters.clear()
    m = XCiT('nano_12_p16', out_indices=EARLY, drop_path_rate=0.1,
             compile_blocks=dict(backend='aot_eager')).train()
    for h, w in sizes[::5] + sizes[-1:]:
        sum(o.mean() for o in m(torch.randn(1, 3, h, w))).backward()
    graphs = counters['stats']['unique_graphs']
    assert 1 <= graphs <= 8, (graphs, dict(counters['recompile_reasons']))
    assert not counters['graph_break'], dict(counters['graph_break'])
    torch._dynamo.reset()


def _train(compile_blocks: bool, steps: int = 5):
    """``steps`` float32 training steps of the segmentation demo's model (drop path 0.1, timm's
    XCiT forward) and its optimizer (AdamW) on batches of two 128 x 128 images: the losses, the
    first step's gradients and the weights after the last step."""
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    cfg = Config.fromfile(DEMO_SEG)
    cfg.model.backbone.update(drop_path_rate=0.1, compile_blocks=compile_blocks, gram_xca=False)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    losses, first = [], None
    for step in range(steps):
        torch.manual_seed(10 + step)
        data = model.data_preprocessor(
            seg_inputs(2, 128, 128, num_classes=cfg.model.decode_head.num_classes), True)
        torch.manual_seed(100 + step)  # the drop-path draws: the same in both runs
        loss, _ = model.parse_losses(model(**data, mode='loss'))
        loss.backward()
        if first is None:
            first = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        optim_wrapper.step()
        optim_wrapper.zero_grad()
        losses.append(float(loss))
    return losses, first, {n: p.detach() for n, p in model.named_parameters()}


@needs_inlining
@pytest.mark.slow
def test_the_segmentation_demo_compiled_trains_as_eager():
    """The segmentation demo's model (XCiT-N12/16), drop path on, 5 float32 AdamW steps eager
    and with the blocks compiled by inductor (``fallback_random``: its random numbers are
    torch's): every loss within 1e-5, the first step's gradients within 1e-4 (a gradient zero up
    to rounding, a bias before a BatchNorm, within 1e-7 of the largest) and the weights after the
    fifth step within 1e-4 of eager's (relative, all weights together). Measured (2-core Intel
    Xeon, native kernels): 8.3e-8, 1.3e-6 and 1.7e-7; eager on 1 thread against 2: 8.4e-8, 1.8e-6
    and 2.3e-7. ~30 s: inductor compiles the attention and the MLP, forward and backward."""
    import torch._inductor.config as inductor_config
    threads = torch.get_num_threads()
    # 1 thread, as the suite's processes compute: on torch 2.14.1 and 2.15.0 the blocks compiled
    # on 2 threads put two small gradients (the adapter's stride-4 level, the neck's second
    # lateral conv) 1.3e-3 off a float64 run, eager 2e-6 (docs/training.md#compiling-the-backbone)
    torch.set_num_threads(1)
    try:
        eager_losses, eager_grads, eager_weights = _train(False)
        with inductor_config.patch(fallback_random=True):
            losses, grads, weights = _train(True)
    finally:
        torch.set_num_threads(threads)
    assert losses == pytest.approx(eager_losses, rel=1e-5), (losses, eager_losses)
    assert grads.keys() == eager_grads.keys() and len(grads) > 100
    floor = 1e-3 * max(g.norm() for g in eager_grads.values())
    worst = max((((grads[n] - g).norm() / torch.maximum(g.norm(), floor)).item(), n)
                for n, g in eager_grads.items())
    assert worst[0] <= 1e-4, worst
    drift = (sum(((weights[n] - w) ** 2).sum() for n, w in eager_weights.items())
             / sum((w ** 2).sum() for w in eager_weights.values())).sqrt().item()
    assert drift <= 1e-4, drift
