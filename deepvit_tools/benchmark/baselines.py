"""What our backbones are timed against, each built as ``Baseline(backbone, size, batch)`` from
the backbone it is compared with; ``forward(x)`` returns tensors, ``checks_output`` says whether
they must equal ours. ``BASELINES`` names them for ``compare``: ``timm`` (``TimmBaseline``) and
``floor`` (``GemmFloor``).
"""
from typing import Dict, Tuple, Type

import torch
import torch.nn as nn
import torch.nn.functional as F

from .models import padded_size

__all__ = ['BASELINES']

# Trunk parts the backbones never build (the classification stages): not expected to load.
_CLASSIFIER = ('cls_attn_blocks.', 'blocks_token_only.', 'cls_token', 'norm.', 'head.')


def _drop_path_rate(backbone: nn.Module) -> float:
    # the same stochastic depth, so that a training step does the same work
    for m in backbone.trunk.blocks[0].modules():
        if hasattr(m, 'drop_prob'):
            return float(m.drop_prob)
    return 0.0


def _timm_xcit(backbone: nn.Module, grid: Tuple[int, int]) -> nn.Module:
    import timm
    spec = backbone.arch_zoo[backbone.arch]
    # XCiT's Fourier position encoding is computed per input: timm's model runs at any size
    return timm.create_model(spec.timm, pretrained=False, num_classes=0,
                             drop_path_rate=_drop_path_rate(backbone))


def _timm_cait(backbone: nn.Module, grid: Tuple[int, int]) -> nn.Module:
    from timm.models.cait import Cait
    if backbone.window_size:
        raise ValueError(f'CaiT({backbone.arch}) with window_size={backbone.window_size}: timm\'s '
                         'Cait has global attention only; compare with window_size=0.')
    spec = backbone.arch_zoo[backbone.arch]
    # timm 1.0's Cait adds its position embedding as stored (no dynamic_img_size): it runs only
    # at the grid it is built for. Build it at the input's grid and give it our embedding
    # resampled to that grid once (see TimmBaseline), the same tensor our forward adds.
    p = backbone.patch_size
    return Cait(img_size=(grid[0] * p, grid[1] * p), patch_size=p, embed_dim=spec.embed_dim,
                depth=len(backbone.trunk.blocks), num_heads=spec.num_heads,
                drop_path_rate=_drop_path_rate(backbone), num_classes=0)


class TimmBaseline(nn.Module):
    """timm's ``forward_intermediates`` on our backbone's trunk weights, then the same adapter
    (shared, not copied): the standard model's cost of the very same computation.

    XCiT: timm's ``Xcit`` by its registered name. CaiT: timm's ``Cait`` built at the input's
    patch grid (timm's runs only at the grid it is built for) with our position embedding
    resampled to that grid once, here (ours resamples it in each training forward).

    Args:
        backbone (nn.Module): The backbone compared with.
        size (tuple[int, int]): Input ``(H, W)``.
        batch (int): Images per call. Default: 1.
    """
    checks_output = True
    _builders = {'XCiT': _timm_xcit, 'CaiT': _timm_cait}

    def __init__(self, backbone: nn.Module, size: Tuple[int, int], batch: int = 1) -> None:
        super().__init__()
        family = type(backbone).__name__
        if family not in self._builders:
            raise ValueError(f'no timm baseline for {family}: known for '
                             f'{", ".join(self._builders)}')
        h, w = padded_size(backbone, size)
        grid = (h // backbone.patch_size, w // backbone.patch_size)
        self.indices = list(backbone.out_indices)
        self.timm_model = self._builders[family](backbone, grid)
        self.timm_model.prune_intermediate_layers(self.indices, prune_norm=True, prune_head=True)
        state = dict(backbone.trunk.state_dict())
        if family == 'CaiT':
            with torch.no_grad():
                state['pos_embed'] = backbone.pos_embed_for(grid).detach().clone()
        missing, unexpected = self.timm_model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith(_CLASSIFIER)]
        if unexpected or missing:
            raise RuntimeError(f'timm baseline: the trunk weights do not fit timm\'s {family} '
                               f'(unexpected {unexpected[:5]}, missing {missing[:5]})')
        self.adapter = backbone.adapter
        # the simple pyramid rescales its one tap to every level, as the backbone's forward does
        self.levels = len(backbone.out_strides) if backbone.pyramid == 'simple' else 1
        self.pad_to = backbone.pad_to
        self.pad_input = getattr(backbone, 'pad_input', True)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        h, w = x.shape[-2:]
        ph, pw = (-h) % self.pad_to, (-w) % self.pad_to
        if self.pad_input and (ph or pw):
            x = F.pad(x, (0, pw, 0, ph))
        feats = self.timm_model.forward_intermediates(x, indices=self.indices,
                                                      intermediates_only=True)
        return self.adapter(list(feats) * self.levels)


class GemmFloor(nn.Module):
    """The standard model's block GEMMs as plain ``torch.mm`` / ``torch.bmm`` on the same shapes:
    a floor no implementation of the blocks goes below.

    Per block on ``B * N`` tokens of ``C`` channels: qkv ``(C, 3C)``, proj ``(C, C)``, fc1
    ``(C, 4C)``, fc2 ``(4C, C)`` (fc2's output feeds the next block); where attention mixes
    tokens (CaiT) also ``q k^T`` and ``attn v`` per head over the block's span (all tokens or a
    window). XCiT's per-head ``C x C`` products, talking-heads mixing, softmax, the patch
    embedding and the adapter are left out. A training step adds autograd's two backward
    products per product.

    Args:
        backbone (nn.Module): The backbone compared with.
        size (tuple[int, int]): Input ``(H, W)``.
        batch (int): Images per call. Default: 1.
    """
    checks_output = False

    def __init__(self, backbone: nn.Module, size: Tuple[int, int], batch: int = 1) -> None:
        super().__init__()
        h, w = padded_size(backbone, size)
        p, c = backbone.patch_size, backbone.embed_dim
        self.tokens = batch * (h // p) * (w // p)
        self.blocks = len(backbone.trunk.blocks)
        gen = torch.Generator().manual_seed(0)

        def weight(i, o):  # unit-variance outputs over a chain of blocks
            return nn.Parameter(torch.randn(i, o, generator=gen) / i ** 0.5)

        self.weights = nn.ParameterList(
            weight(i, o) for _ in range(self.blocks)
            for i, o in ((c, 3 * c), (c, c), (c, 4 * c), (4 * c, c)))
        self.register_buffer('x0', torch.randn(self.tokens, c, generator=gen), persistent=False)
        # token-mixing attention (CaiT): per block, (groups, span, head dim) of q, k and v
        self.spans = [self._span(blk, backbone, (h // p, w // p), batch, c)
                      for blk in backbone.trunk.blocks] if hasattr(backbone, 'window_size') \
            else []
        for shape in set(self.spans):
            self.register_buffer(self._qkv_name(shape), torch.randn(3, *shape, generator=gen),
                                 persistent=False)

    @staticmethod
    def _span(blk: nn.Module, backbone: nn.Module, grid: Tuple[int, int], batch: int,
              c: int) -> Tuple[int, int, int]:
        heads = blk.attn.num_heads
        win = getattr(blk.attn, 'window_size', 0)
        if not win:
            return batch * heads, grid[0] * grid[1], c // heads
        windows = -(-grid[0] // win) * -(-grid[1] // win)  # padded to whole windows
        return batch * windows * heads, win * win, c // heads

    @staticmethod
    def _qkv_name(shape: Tuple[int, int, int]) -> str:
        return 'qkv_{}_{}_{}'.format(*shape)

    @property
    def multiply_adds(self) -> int:
        """Forward multiply-adds per call."""
        gemm = sum(w.shape[0] * w.shape[1] for w in self.weights) * self.tokens
        return gemm + sum(2 * g * n * n * d for g, n, d in self.spans)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        t = self.x0.to(x.dtype) if x.dtype.is_floating_point else self.x0
        if torch.is_grad_enabled():
            t = t.detach().requires_grad_()  # input gradients, as a block inside a trunk has
        acc = t.new_zeros(())
        for i in range(self.blocks):
            w_qkv, w_proj, w_fc1, w_fc2 = self.weights[4 * i:4 * i + 4]
            # the means keep every product in the loss; they cost ~1/C of the GEMMs
            acc = acc + torch.mm(t, w_qkv).mean() + torch.mm(t, w_proj).mean()
            if self.spans:
                q, k, v = getattr(self, self._qkv_name(self.spans[i])).to(t.dtype)
                if torch.is_grad_enabled():
                    q, k, v = (z.detach().requires_grad_() for z in (q, k, v))
                acc = acc + torch.bmm(torch.bmm(q, k.transpose(1, 2)), v).mean()
            t = torch.mm(torch.mm(t, w_fc1), w_fc2)
        return acc, t


BASELINES: Dict[str, Type[nn.Module]] = {'timm': TimmBaseline, 'floor': GemmFloor}
