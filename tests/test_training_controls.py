"""frozen_stages, norm_eval and with_cp of every columnar backbone, built through mmdet's and
mmseg's registries: gradients, BatchNorm modes and statistics, checkpointing parity."""
import pytest
import torch
from mmdet.registry import MODELS as MMDET_MODELS
from mmseg.registry import MODELS as MMSEG_MODELS
from torch.nn.modules.batchnorm import _BatchNorm

from deepvit_mm import ColumnarBackbone

REGISTRIES = {'mmdet': MMDET_MODELS, 'mmseg': MMSEG_MODELS}


def _smallest(fam):
    # the cheapest arch of the family; patch 16 (its adapter has a BatchNorm) on a tie
    return min(fam.arch_zoo, key=lambda a: (fam.arch_zoo[a].embed_dim * fam.arch_zoo[a].depth,
                                            -fam.arch_zoo[a].patch_size))


FAMILIES = [pytest.param(fam.__name__, _smallest(fam), id=fam.__name__)
            for fam in ColumnarBackbone.families]


def _build(registry, family, arch, **kwargs) -> ColumnarBackbone:
    m = REGISTRIES[registry].build(dict(type=family, arch=arch, **kwargs))
    assert isinstance(m, ColumnarBackbone)
    # non-trivial statistics, so that a frozen BatchNorm's output differs from a training one's
    for bn in m.modules():
        if isinstance(bn, _BatchNorm):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
    return m


def _embedding(m: ColumnarBackbone):
    mods = [m.trunk.patch_embed]
    pos = getattr(m.trunk, 'pos_embed', None)
    return mods + ([pos] if isinstance(pos, torch.nn.Module) else []), (
        [pos] if isinstance(pos, torch.nn.Parameter) else [])


def _frozen_and_trainable(m: ColumnarBackbone, k: int):
    emb_mods, emb_params = _embedding(m)
    frozen_mods = (emb_mods + list(m.trunk.blocks[:k])) if k >= 0 else []
    frozen = {id(p) for mod in frozen_mods for p in mod.parameters()}
    if k >= 0:
        frozen |= {id(p) for p in emb_params}
    names = dict((id(p), n) for n, p in m.named_parameters())
    return ({names[i] for i in frozen},
            {n for n, p in m.named_parameters() if id(p) not in frozen}, frozen_mods)


def _step(m, hw=(64, 96)):
    out = m(torch.randn(2, m.in_chans, *hw))
    sum(o.square().mean() for o in out).backward()
    return out


def _stats(m):
    return {n: b.clone() for n, b in m.named_buffers()}


@pytest.mark.parametrize('registry', REGISTRIES)
@pytest.mark.parametrize('family,arch', FAMILIES)
@pytest.mark.parametrize('k', [-1, 0, 3])
def test_frozen_stages(registry, family, arch, k):
    m = _build(registry, family, arch, frozen_stages=k)
    m.train()  # what mmengine's loop does before training: freezing must survive it
    frozen, trainable, frozen_mods = _frozen_and_trainable(m, k)
    assert trainable and (k < 0) == (not frozen)
    params = dict(m.named_parameters())
    assert all(not params[n].requires_grad for n in frozen)
    assert all(params[n].requires_grad for n in trainable)

    frozen_bns = {id(bn) for mod in frozen_mods for bn in mod.modules() if isinstance(bn, _BatchNorm)}
    all_bns = [(n, bn) for n, bn in m.named_modules() if isinstance(bn, _BatchNorm)]
    assert all(bn.training == (id(bn) not in frozen_bns) for _, bn in all_bns)
    if k >= 0 and family == 'XCiT':
        assert frozen_bns  # the conv patch embedding's BatchNorms (and LPI's of frozen blocks)
    # the frozen modules are entirely in eval mode (drop path off too), the rest is training
    assert all(not sub.training for mod in frozen_mods for sub in mod.modules())
    assert m.trunk.blocks[-1].training and m.adapter.training

    before = _stats(m)
    _step(m)
    assert all(params[n].grad is None for n in frozen)
    assert all(params[n].grad is not None and torch.isfinite(params[n].grad).all()
               for n in trainable)
    after = _stats(m)
    frozen_bn_names = {n for n, bn in all_bns if id(bn) in frozen_bns}
    for n in before:
        owner = n.rsplit('.', 1)[0]
        if owner in frozen_bn_names:
            assert torch.equal(before[n], after[n]), f'{n} of a frozen BatchNorm changed'
        elif owner in {name for name, _ in all_bns} and n.endswith('running_mean'):
            assert not torch.equal(before[n], after[n]), f'{n} of a training BatchNorm unchanged'

    m.eval()
    assert not any(mod.training for mod in m.modules())
    m.train()
    assert all(bn.training == (id(bn) not in frozen_bns) for _, bn in all_bns)


@pytest.mark.parametrize('registry', REGISTRIES)
@pytest.mark.parametrize('family,arch', FAMILIES)
def test_norm_eval(registry, family, arch):
    m = _build(registry, family, arch, norm_eval=True).train()
    bns = [bn for bn in m.modules() if isinstance(bn, _BatchNorm)]
    others = [mod for mod in m.modules() if not isinstance(mod, _BatchNorm)]
    assert all(not bn.training for bn in bns)
    assert all(mod.training for mod in others)  # LayerNorms, dropout, drop path: training
    before = _stats(m)
    _step(m)
    after = _stats(m)
    assert all(torch.equal(before[n], after[n]) for n in before)
    # norm_eval fixes statistics only: every parameter still learns (as in mmdet's ResNet)
    assert all(p.grad is not None for p in m.parameters())


@pytest.mark.parametrize('family,arch', FAMILIES)
@pytest.mark.parametrize('bad', [-2, 10 ** 3])
def test_frozen_stages_out_of_range_refused(family, arch, bad):
    with pytest.raises(ValueError, match='frozen_stages'):
        _build('mmdet', family, arch, frozen_stages=bad)


def _count_block_calls(m):
    calls = [0] * len(m.trunk.blocks)
    for i, blk in enumerate(m.trunk.blocks):
        blk.register_forward_hook(lambda *a, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


@pytest.mark.parametrize('family,arch', FAMILIES)
@pytest.mark.parametrize('k', [-1, 2])
def test_with_cp_same_outputs_grads_and_statistics(family, arch, k):
    kw = dict(frozen_stages=k, drop_path_rate=0.2)  # drop path: checkpointing must replay it
    ref = _build('mmdet', family, arch, **kw).train()
    cp = _build('mmseg', family, arch, with_cp=True, **kw).train()
    cp.load_state_dict(ref.state_dict())
    ref_calls, cp_calls = _count_block_calls(ref), _count_block_calls(cp)
    outs = []
    for m in (ref, cp):
        torch.manual_seed(1)
        outs.append(_step(m))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    ref_p, cp_p = dict(ref.named_parameters()), dict(cp.named_parameters())
    for n, p in ref_p.items():
        if p.grad is None:
            assert cp_p[n].grad is None
        else:
            torch.testing.assert_close(cp_p[n].grad, p.grad, rtol=1e-5, atol=1e-7, msg=n)
    # BatchNorm statistics take one update per step, not a second one from the recomputation
    ref_b, cp_b = _stats(ref), _stats(cp)
    assert all(torch.equal(ref_b[n], cp_b[n]) for n in ref_b)
    # per-block checkpointing: every trainable block runs again in the backward pass
    assert ref_calls == [1] * len(ref_calls)
    first = max(k, 0)
    assert cp_calls == [1] * first + [2] * (len(cp_calls) - first)


@pytest.mark.parametrize('family,arch', FAMILIES)
def test_with_cp_statistics_survive_mmengines_syncbn_revert(family, arch):
    """A single-process run of a SyncBN config: mmengine swaps every SyncBN for a new BN module."""
    from mmengine.model.utils import revert_sync_batchnorm
    ref = _build('mmdet', family, arch).train()
    cp = _build('mmdet', family, arch, with_cp=True,
                norm_cfg=dict(type='SyncBN', requires_grad=True))
    cp = revert_sync_batchnorm(cp).train()
    cp.load_state_dict(ref.state_dict())
    for m in (ref, cp):
        torch.manual_seed(1)
        _step(m)
    ref_b, cp_b = _stats(ref), _stats(cp)
    assert all(torch.equal(ref_b[n], cp_b[n]) for n in ref_b)
