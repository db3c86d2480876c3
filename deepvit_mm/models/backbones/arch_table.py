"""Architecture tables: every family's arch names and what each one is.

One mechanism for every family (``ArchTable``): what timm's model of an arch is (width, depth,
patch, heads, resolution) is read from timm's registry, the model built on the meta device (no
memory, no initialisation), and the paper's settings (stochastic depth, LayerScale, the taps) sit
beside it; an arch the paper has and timm has not (CaiT's XS36, S48, M24) gives its dimensions
with its settings. Nothing is read when the package is imported: the names when a family's table
is first looked into, an arch's row when that arch is asked for.
"""
import dataclasses
import difflib
import functools
import re
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple

from timm.layers import to_2tuple

from ...utils import meta_device
from .timm_releases import create_model

__all__ = ['ArchSpec', 'ArchTable']


@dataclasses.dataclass(frozen=True)
class ArchSpec:
    """One row of an architecture table.

    Attributes:
        timm (str, optional): timm's model name; None where timm has no such model.
        embed_dim, depth, patch_size (int): Width, blocks, patch side.
        drop_path_rate (float): The paper's stochastic depth.
        eta (float, optional): The paper's LayerScale init; None: as timm builds the model.
        out_indices (tuple[int]): The paper's taps for strides 4/8/16/32.
        num_heads (int, optional): Attention heads, where the family builds its trunk with them.
        img_size (tuple[int, int], optional): The resolution timm builds the model for, where the
            family's trunk is built for one.
    """
    timm: Optional[str]
    embed_dim: int
    depth: int
    patch_size: int
    drop_path_rate: float
    eta: Optional[float]
    out_indices: Tuple[int, ...]
    num_heads: Optional[int] = None
    img_size: Optional[Tuple[int, int]] = None

    @property
    def tap_stride(self) -> int:
        """The stride the taps are resampled to: the patch side, or the next power of two."""
        return tap_stride_for(self.patch_size)


def tap_stride_for(patch: int) -> int:
    """The smallest power of two >= ``patch``: the stride the taps are resampled to."""
    return 1 << (patch - 1).bit_length()


@functools.cache
def read_timm_arch(name: str) -> Dict[str, Any]:
    """What timm's model ``name`` is: ``embed_dim``, ``depth``, ``patch_size``, ``num_heads``,
    ``img_size``, read from the model built on the meta device."""
    with meta_device():
        m = create_model(name, pretrained=False, num_classes=0)
    patch = to_2tuple(m.patch_embed.patch_size)
    if patch[0] != patch[1]:
        raise ValueError(f'{name}: patches of {patch[0]}x{patch[1]} pixels; the pyramid takes square '
                         'patches only.')
    return dict(embed_dim=m.embed_dim, depth=len(m.blocks), patch_size=patch[0],
                num_heads=m.blocks[0].attn.num_heads,
                img_size=tuple(to_2tuple(m.patch_embed.img_size)))


class ArchTable(Mapping):
    """A family's archs: name -> ``ArchSpec``, and the names it takes for them (``resolve``).

    Args:
        names (callable): Returns each arch's timm name (None where timm has no such model), in
            the table's order; called when the table is first looked into.
        settings (callable): ``settings(name, read)`` -> the paper's settings of arch ``name``
            (``drop_path_rate``, ``eta``, ``out_indices``; and ``embed_dim``, ``depth``,
            ``patch_size``, ``num_heads`` where timm has no such model), given what timm's model
            is (``read``: ``read_timm_arch``'s dict, empty where timm has none); called once an
            arch.
        name_pattern (str): A regex whose first group turns a timm model name into a key of the
            table (``xcit_small_12_p8_224`` -> ``small_12_p8``). Default: keys only.
    """

    def __init__(self, names: Callable[[], Mapping[str, Optional[str]]],
                 settings: Callable[[str, Dict[str, Any]], Dict[str, Any]],
                 name_pattern: str = '') -> None:
        self._read_names, self._settings = names, settings
        self.name_pattern = name_pattern
        self._specs: Dict[str, ArchSpec] = {}

    @functools.cached_property
    def _names(self) -> Dict[str, Optional[str]]:
        return dict(self._read_names())

    def __contains__(self, name) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __getitem__(self, name: str) -> ArchSpec:
        if name not in self._specs:
            timm_name = self._names[name]  # KeyError: not an arch of the table
            read = read_timm_arch(timm_name) if timm_name is not None else {}
            self._specs[name] = ArchSpec(timm=timm_name, **{**read, **self._settings(name, read)})
        return self._specs[name]

    @property
    def examples(self) -> Tuple[str, ...]:
        """The archs a checkpoint's arch is looked for among (``families.arch_from_state_dict``):
        every arch of the table."""
        return tuple(self)

    def resolve(self, arch: str, family: str) -> str:
        """Map a short name (``small_12_p8``) or timm name (``xcit_small_12_p8_224``, a pretrained
        tag such as ``.fb_in1k`` ignored) to a key of the table; anything else raises with the
        valid names and the closest one. ``family`` names the backbone in the messages."""
        if not isinstance(arch, str):
            raise TypeError(f'{family}: arch must be a string, got {type(arch).__name__}')
        name = arch.strip().lower().split('.')[0]
        if name not in self and self.name_pattern:
            m = re.fullmatch(self.name_pattern, name)
            name = m.group(1) if m else name
        if name not in self:
            close = difflib.get_close_matches(name, list(self), n=1)
            raise ValueError(
                f'{family}: unknown arch {arch!r}.'
                + (f' Did you mean {close[0]!r}?' if close else '')
                + f' Valid: {self.valid_names()}.')
        return name

    def valid_names(self) -> str:
        """The names the table takes, for an error message."""
        return (f'{", ".join(self)} (or timm names such as '
                f'{next(iter(self.values())).timm!r})')

    def arch_with(self, traits: Optional[Dict[str, int]]) -> Optional[str]:
        """The first of ``examples`` whose spec has ``traits`` (``ArchSpec`` field -> value);
        None if none has them or ``traits`` is None."""
        if traits is None:
            return None
        return next((name for name in self.examples
                     if all(getattr(self[name], k) == v for k, v in traits.items())), None)
