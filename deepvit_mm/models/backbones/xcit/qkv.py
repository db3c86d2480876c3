"""Non-linear Q/K/V embeddings for XCiT: SNE, P-SNE and F-SNE.

Paper: "Non-linear Q, K, V embeddings for vision transformers" (section 4, Tables 1 and 2;
``shared/papers/001_ba73134f32a0ad10.txt``). Each module here replaces timm's ``XCA.qkv``
``nn.Linear(d, 3d)``: it maps tokens ``(B, N, d)`` to ``(B, N, 3d)`` laid out as ``[Q | K | V]``,
exactly what timm's XCA reshapes into heads, so the rest of XCA (l2-normalisation, temperature,
block-diagonal heads, output projection) is timm's own and untouched.

* **SNE** (eq. 4):   ``Q = σ(X W1q) W2q``, ``K = σ(X W1k) W2k``, ``V = σ(X W1v) W2v``.
* **P-SNE** (eq. 5): the second layer is shared: ``Q = σ(X W1q) W2s``, ...
* **F-SNE** (eq. 6): both layers shared by Q, K and V; a learned code of size ``c`` is
  concatenated to every token: ``Q = σ((X ⊕ Cq) W1s) W2s``, ... The codes ``Cq, Ck, Cv`` are one
  set of parameters shared by all layers (``QKVCodes``, owned by the model, see ``set_qkv_embed``).

σ is ReLU. Every layer is a linear layer with a bias, as the linear Q/K/V embedding it replaces
(XCiT uses ``qkv_bias=True``; the paper writes both as bare products ``X·W``); the widths of Table 1
are parameter-matched under exactly that convention (see ``qkv_hidden``).

Hidden widths (paper Table 1 for d = 128 / 192; the rule we use for every other width):

=============  ===============  ==============================================================
variant        d = 128 / 192    rule for any d (documented in ``qkv_hidden``)
=============  ===============  ==============================================================
Linear         (d)              timm's own ``nn.Linear(d, 3d)``, not replaced
SNE            64 / 96          d/2: 2 layers x 3 branches, as many parameters as the linear one
P-SNE          96 / 144         3d/4: 3 first layers + 1 shared second layer, likewise
F-SNE c        128 / 192        d
F-SNE c, '*'   8: 186 / 282,    the widest layer with no more parameters than the linear one:
               16: 182 / 276    ``floor((3d² + 2d) / (2d + c + 1))``
=============  ===============  ==============================================================
"""
import math
from typing import Dict, Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import trunc_normal_
from timm.models.xcit import XCA

__all__ = ['SNE', 'PSNE', 'FSNE', 'qkv_hidden']

# Paper Table 1, the "*" rows: F-SNE widths that spend the parameters saved by sharing on width,
# keyed by (embed dim d, code size c).
PAPER_STAR_WIDTHS: Dict[Tuple[int, int], int] = {
    (128, 8): 186, (128, 16): 182,
    (192, 8): 282, (192, 16): 276,
}


def _init_linear(m: nn.Module) -> None:
    # timm's XCiT initialisation of its linear layers (Xcit._init_weights)
    if isinstance(m, (nn.Linear, BranchLinear)):
        trunc_normal_(m.weight, std=.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


class BranchLinear(nn.Module):
    """``branches`` independent linear layers applied to the branch axis of ``(..., branches, in)``.

    Numerically the same as ``branches`` separate ``nn.Linear`` layers, in one batched product.

    Args:
        branches (int): Number of independent layers (3: Q, K, V).
        in_features (int): Input width of each.
        out_features (int): Output width of each.
        bias (bool): Add a bias. Default: True.
    """

    def __init__(self, branches: int, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.branches, self.in_features, self.out_features = branches, in_features, out_features
        self.weight = nn.Parameter(torch.empty(branches, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(branches, out_features)) if bias else None
        _init_linear(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.einsum('...si,soi->...so', x, self.weight)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f'branches={self.branches}, in_features={self.in_features}, '
                f'out_features={self.out_features}, bias={self.bias is not None}')


class SNE(nn.Module):
    """Separate non-linear embedding (paper eq. 4): a 2-layer ReLU MLP per Q, K and V.

    Args:
        dim (int): Token width ``d``.
        hidden (int): Hidden width ``dq = dk = dv``.
        bias (bool): Biases in both layers. Default: True.
    """

    def __init__(self, dim: int, hidden: int, bias: bool = True):
        super().__init__()
        self.dim, self.hidden = dim, hidden
        self.fc1 = nn.Linear(dim, 3 * hidden, bias=bias)  # W1q | W1k | W1v in one product
        self.act = nn.ReLU()
        self.fc2 = BranchLinear(3, hidden, dim, bias=bias)  # W2q, W2k, W2v
        _init_linear(self.fc1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x)).unflatten(-1, (3, self.hidden))  # (B, N, 3, hidden)
        return self.fc2(h).flatten(-2)  # (B, N, 3 * dim) = [Q | K | V]


class PSNE(nn.Module):
    """Partially shared non-linear embedding (paper eq. 5): separate first layers, one second
    layer shared by Q, K and V.

    Args:
        dim (int): Token width ``d``.
        hidden (int): Hidden width ``ds``.
        bias (bool): Biases in both layers. Default: True.
    """

    def __init__(self, dim: int, hidden: int, bias: bool = True):
        super().__init__()
        self.dim, self.hidden = dim, hidden
        self.fc1 = nn.Linear(dim, 3 * hidden, bias=bias)  # W1q | W1k | W1v
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, dim, bias=bias)  # W2s
        self.apply(_init_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x)).unflatten(-1, (3, self.hidden))
        return self.fc2(h).flatten(-2)


class QKVCodes(nn.Module):
    """The F-SNE codes ``Cq, Ck, Cv`` (paper eq. 6), one ``(3, code_size)`` parameter shared by
    every F-SNE layer of a model.

    Initialised from N(0, 1), the scale of the layer-normed tokens they are concatenated with (the
    paper does not say; its trained codes have norms of about 8.5 for c = 8, Table 6). The paper
    regularises only the network weights, not the codes (eq. 7): exempt ``qkv_codes`` from weight
    decay in the optimizer config.

    Args:
        code_size (int): ``c``.
    """

    def __init__(self, code_size: int):
        super().__init__()
        self.code_size = code_size
        self.weight = nn.Parameter(torch.randn(3, code_size))

    def extra_repr(self) -> str:
        return f'code_size={self.code_size}'


class FSNE(nn.Module):
    """Fully shared non-linear embedding with codes (paper eq. 6).

    Both layers are shared by Q, K and V; the branches differ only by the code concatenated to the
    tokens. ``(X ⊕ C) W1s`` is computed as ``X W1s[:d] + C W1s[d:]``: the same product without
    materialising three concatenated copies of the tokens.

    The codes are *referenced*, not owned: they belong to the model (``set_qkv_embed`` registers
    them once as ``model.qkv_codes``), so ``parameters()``, ``state_dict()`` and optimizers see them
    once however many layers use them.

    Args:
        dim (int): Token width ``d``.
        hidden (int): Hidden width ``ds``.
        codes (QKVCodes): The model's shared codes.
        bias (bool): Biases in both layers. Default: True.
    """

    def __init__(self, dim: int, hidden: int, codes: QKVCodes, bias: bool = True):
        super().__init__()
        if not isinstance(codes, QKVCodes):
            raise TypeError(f'FSNE needs the model\'s shared QKVCodes, got {type(codes).__name__}')
        self.dim, self.hidden = dim, hidden
        # reason: a plain (unregistered) reference keeps the shared codes out of this layer's
        # parameters() and state_dict(); the owner module is looked up at every call, so moving,
        # casting or re-assigning the owner's parameter is always seen here
        object.__setattr__(self, 'codes', codes)
        self.fc1 = nn.Linear(dim + codes.code_size, hidden, bias=bias)  # W1s, input X ⊕ C
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, dim, bias=bias)  # W2s
        self.apply(_init_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.fc1.weight
        tokens = F.linear(x, w[:, :self.dim])  # (B, N, hidden), once for Q, K and V
        codes = F.linear(self.codes.weight, w[:, self.dim:], self.fc1.bias)  # (3, hidden)
        h = self.act(tokens.unsqueeze(-2) + codes)  # (B, N, 3, hidden)
        return self.fc2(h).flatten(-2)

    def extra_repr(self) -> str:
        return f'codes: shared (3, {self.codes.code_size}), owned by the model'


QKV_TYPES = ('Linear', 'SNE', 'PSNE', 'FSNE')
_ARGS = {'Linear': set(), 'SNE': {'hidden', 'bias'}, 'PSNE': {'hidden', 'bias'},
         'FSNE': {'hidden', 'bias', 'code_size'}}


def normalize_qkv_cfg(qkv_cfg: Optional[dict]) -> dict:
    """Check a ``qkv_cfg`` and return it with its type spelled canonically.

    The paper's spellings ``'P-SNE'``/``'F-SNE'`` and any letter case are accepted; ``hidden`` of
    F-SNE may be ``'*'`` (the parameter-matched width).

    Args:
        qkv_cfg (dict, optional): ``None`` or ``dict(type='Linear')`` (timm's linear embedding),
            ``dict(type='SNE' | 'PSNE', hidden=None, bias=None)`` or
            ``dict(type='FSNE', code_size=8, hidden=None, bias=None)``.

    Returns:
        dict: A new dict with ``type`` one of ``QKV_TYPES``.

    Raises:
        TypeError, ValueError: With what is wrong and the accepted values.
    """
    if qkv_cfg is None:
        return dict(type='Linear')
    if not isinstance(qkv_cfg, dict) or 'type' not in qkv_cfg:
        raise TypeError(f"qkv_cfg must be a dict with a 'type' (one of {', '.join(QKV_TYPES)}), "
                        f"got {qkv_cfg!r}; e.g. qkv_cfg=dict(type='PSNE').")
    cfg = dict(qkv_cfg)
    key = str(cfg['type']).replace('-', '').replace('_', '').upper()
    canon = {t.upper(): t for t in QKV_TYPES}
    if key not in canon:
        raise ValueError(f"qkv_cfg: unknown type {cfg['type']!r}; valid: {', '.join(QKV_TYPES)}.")
    cfg['type'] = canon[key]
    extra = sorted(set(cfg) - {'type'} - _ARGS[cfg['type']])
    if extra:
        allowed = ', '.join(sorted(_ARGS[cfg['type']])) or 'nothing'
        raise ValueError(f"qkv_cfg: type {cfg['type']!r} takes {allowed}; got {', '.join(extra)}.")
    if cfg['type'] == 'FSNE':
        c = cfg.setdefault('code_size', 8)
        if not isinstance(c, int) or isinstance(c, bool) or c < 1:
            raise ValueError(f'qkv_cfg: code_size must be a positive int (the paper uses 8, 16, 32 '
                             f'or 64), got {c!r}.')
    h = cfg.get('hidden')
    if h == '*' and cfg['type'] != 'FSNE':
        raise ValueError(f"qkv_cfg: hidden='*' (the parameter-matched width of Table 1) exists "
                         f"for FSNE only; {cfg['type']}'s default width is already "
                         'parameter-matched: leave hidden unset.')
    if h is not None and h != '*' and (not isinstance(h, int) or isinstance(h, bool) or h < 1):
        raise ValueError(f"qkv_cfg: hidden must be a positive int, None (the paper's width) "
                         f"or '*' (FSNE), got {h!r}.")
    return cfg


def qkv_hidden(qkv_type: str, dim: int, hidden: Union[int, str, None] = None,
               code_size: int = 8, bias: bool = True) -> int:
    """The hidden width of a Q/K/V embedding.

    Args:
        qkv_type (str): ``'SNE'``, ``'PSNE'`` or ``'FSNE'``.
        dim (int): Token width ``d``.
        hidden (int | str, optional): An explicit width; None for the paper's default width;
            ``'*'`` (FSNE) for the parameter-matched width. Default: None.
        code_size (int): F-SNE's ``c``. Default: 8.
        bias (bool): Whether the layers have biases (enters the ``'*'`` rule). Default: True.

    Returns:
        int: For None: SNE ``d/2``, P-SNE ``3d/4``, F-SNE ``d`` (Table 1; SNE's and P-SNE's are the
        widths whose layers have as many weights as the linear ``3d²``). For ``'*'``: Table 1's
        value for (d, c) in {128, 192} x {8, 16}, else the largest width whose F-SNE layer has no
        more parameters than the linear embedding it replaces,
        ``floor((3d² + 2d·b) / (2d + c + b))`` with ``b = 1`` for biases. The rule gives Table 1's
        186, 282 and 276; for (128, 16) it gives 180 where the paper chose 182.
    """
    if isinstance(hidden, int) and not isinstance(hidden, bool):
        return hidden
    if hidden == '*' and qkv_type != 'FSNE':
        raise ValueError(f"hidden='*' exists for FSNE only, not {qkv_type}.")
    if qkv_type == 'SNE':
        return round(dim / 2)
    if qkv_type == 'PSNE':
        return round(3 * dim / 4)
    if hidden is None:
        return dim
    if (dim, code_size) in PAPER_STAR_WIDTHS and bias:
        return PAPER_STAR_WIDTHS[(dim, code_size)]
    b = int(bias)
    return math.floor((3 * dim * dim + 2 * dim * b) / (2 * dim + code_size + b))


def build_qkv_embed(qkv_cfg: dict, dim: int, bias: bool = True,
                    codes: Optional[QKVCodes] = None) -> nn.Module:
    """One Q/K/V embedding module, ``(B, N, dim) -> (B, N, 3 dim)``.

    Args:
        qkv_cfg (dict): See ``normalize_qkv_cfg``; not ``Linear`` (that one is timm's own).
        dim (int): Token width.
        bias (bool): Default for ``qkv_cfg['bias']`` (the replaced linear layer's). Default: True.
        codes (QKVCodes, optional): The model's shared codes; required for FSNE.

    Returns:
        nn.Module: An ``SNE``, ``PSNE`` or ``FSNE``.
    """
    cfg = normalize_qkv_cfg(qkv_cfg)
    kind = cfg['type']
    if kind == 'Linear':
        raise ValueError("build_qkv_embed: the linear embedding is timm's own nn.Linear; "
                         'there is nothing to build.')
    bias = cfg.get('bias') if cfg.get('bias') is not None else bias
    hidden = qkv_hidden(kind, dim, cfg.get('hidden'), cfg.get('code_size', 8), bias)
    if kind == 'FSNE':
        if codes is None:
            raise ValueError('build_qkv_embed: FSNE needs the model\'s shared QKVCodes (codes=); '
                             'use set_qkv_embed to replace the embeddings of a whole model.')
        if codes.code_size != cfg['code_size']:
            raise ValueError(f"build_qkv_embed: codes of size {codes.code_size} given for "
                             f"code_size={cfg['code_size']}.")
        return FSNE(dim, hidden, codes, bias=bias)
    return (SNE if kind == 'SNE' else PSNE)(dim, hidden, bias=bias)


def set_qkv_embed(model: nn.Module, qkv_cfg: Optional[dict]) -> nn.Module:
    """Replace the ``qkv`` linear layer of every timm ``XCA`` in ``model`` (in place).

    Used by the ``XCiT`` backbone, and works on any timm XCiT (classification models included; their
    class-attention blocks are not XCA and keep their linear q, k, v). For FSNE, one ``QKVCodes``
    is registered as ``model.qkv_codes`` and referenced by every layer.

    Args:
        model (nn.Module): A timm ``Xcit`` (or anything holding timm ``XCA`` modules).
        qkv_cfg (dict, optional): See ``normalize_qkv_cfg``. None or Linear changes nothing.

    Returns:
        nn.Module: ``model``.
    """
    cfg = normalize_qkv_cfg(qkv_cfg)
    if cfg['type'] == 'Linear':
        return model
    attns = [m for m in model.modules() if isinstance(m, XCA)]
    if not attns:
        raise ValueError(f'set_qkv_embed: {type(model).__name__} has no timm XCA module; it '
                         'replaces the Q/K/V embedding of timm XCiT models only.')
    codes = None
    if cfg['type'] == 'FSNE':
        if hasattr(model, 'qkv_codes'):
            raise ValueError(f'set_qkv_embed: {type(model).__name__} already has qkv_codes; '
                             'build a fresh model to change its Q/K/V embedding.')
        codes = QKVCodes(cfg['code_size'])
        model.qkv_codes = codes
    for attn in attns:
        if type(attn.qkv) is not nn.Linear:
            raise ValueError(f'set_qkv_embed: the Q/K/V embedding is already '
                             f'{type(attn.qkv).__name__}; build a fresh model to change it.')
        attn.qkv = build_qkv_embed(cfg, attn.qkv.in_features, bias=attn.qkv.bias is not None,
                                   codes=codes)
    return model


def qkv_cfg_from_state_dict(state_dict: Mapping[str, torch.Tensor], prefix: str = '') -> Optional[dict]:
    """The ``qkv_cfg`` a (timm-keyed) XCiT state dict was trained with, for error messages.

    Args:
        state_dict (Mapping): Keys ``{prefix}blocks.0.attn.qkv.*`` and ``{prefix}qkv_codes.*``.
        prefix (str): Prefix of the trunk's keys (``'trunk.'`` for the backbone). Default: ''.

    Returns:
        dict, optional: ``dict(type=..., hidden=..., code_size=...)``, or None when the state dict
        holds no Q/K/V embedding of block 0.
    """
    p = f'{prefix}blocks.0.attn.qkv.'
    if f'{p}weight' in state_dict:
        return dict(type='Linear')
    fc2 = state_dict.get(f'{p}fc2.weight')
    if fc2 is None:
        return None
    if f'{prefix}qkv_codes.weight' in state_dict:
        return dict(type='FSNE', code_size=state_dict[f'{prefix}qkv_codes.weight'].shape[1],
                    hidden=fc2.shape[1])
    return dict(type='SNE' if fc2.dim() == 3 else 'PSNE', hidden=fc2.shape[-1])
