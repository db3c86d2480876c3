"""What the loader asks of a backbone (``deepvit_mm.checkpoints.WeightsTarget``), for every family.

``ColumnarBackbone`` inherits it: any supported checkpoint layout converted to the backbone's keys,
what is dropped on purpose or may stay at init, the family's resizing (CaiT's position embedding),
a description of a checkpoint that does not fit, and ``init_cfg`` / ``load_pretrained`` through
the one loader. The families refine ``convert_trunk_keys``, ``arch_from_state_dict`` and the
patterns.
"""
import re
from typing import Dict, List, Mapping, Optional

import torch

from ...checkpoints import LoadReport, load_weights, read_checkpoint

__all__ = []


class ColumnarWeights:
    """Mixin of ``ColumnarBackbone``: its side of ``checkpoints.WeightsTarget``."""

    def init_weights(self) -> None:
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            self.load_pretrained(cfg['checkpoint'], checkpoint_key=cfg.get('checkpoint_key'))
            self._is_init = True
        else:
            super().init_weights()

    def convert_state_dict(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Any supported layout -> this module's keys (``trunk.*``, ``adapter.*``).

        Accepts our own (``trunk.``/``adapter.``), a detector/segmentor checkpoint (``backbone.``
        prefix, ours or the official XCiT detection code's ``fpn1..fpn4``), official
        classification releases and timm's.
        """
        if any(k.startswith('backbone.') for k in state_dict):
            state_dict = {k[9:]: v for k, v in state_dict.items() if k.startswith('backbone.')}
        if all(k.startswith(('trunk.', 'adapter.')) for k in state_dict):
            return dict(state_dict)
        adapter, rest = {}, {}
        for k, v in state_dict.items():
            m = re.match(r'^fpn(\d)\.(.*)$', k)
            if m:
                adapter[f'adapter.levels.{int(m.group(1)) - 1}.{m.group(2)}'] = v
            else:
                rest[k] = v
        trunk = self.convert_trunk_keys(rest)
        return {**{f'trunk.{k}': v for k, v in trunk.items()}, **adapter}

    def dropped_key_patterns(self) -> List[str]:
        """Regexes of converted checkpoint keys dropped on purpose: the classifier and the blocks
        after the last tap (``checkpoints.WeightsTarget``)."""
        pats = [r'^trunk\.(' + '|'.join(self.classifier_parts) + r')(\.|$)']
        if self.kept_blocks < self.depth:
            pruned = '|'.join(str(i) for i in range(self.kept_blocks, self.depth))
            pats.append(rf'^trunk\.blocks\.({pruned})\.')
        return pats

    def init_ok_key_patterns(self) -> List[str]:
        """Module keys that may stay at init when the checkpoint lacks them."""
        return [r'^adapter\.']

    def resize_weight(self, key: str, value: torch.Tensor,
                      target: torch.Tensor) -> Optional[torch.Tensor]:
        """``value`` resized to ``target``'s shape, or None when it cannot be (the family decides:
        CaiT resamples its position embedding)."""
        return None

    def describe_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> str:
        """What ``state_dict`` (trunk keys) looks like, for a refusal's message."""
        for fam in self.families:
            traits = fam.state_dict_traits(state_dict)
            if traits is None:
                continue
            arch = fam.arch_with_traits(traits)
            if arch is not None:
                return f'It looks like a checkpoint of {fam.__name__}(arch={arch!r})'
            found = ', '.join(f'{k}={v}' for k, v in traits.items())
            return (f'It looks like a checkpoint of {fam.__name__} ({found}), of none of the archs '
                    f'deepvit_mm names')
        names = ', '.join(fam.__name__ for fam in self.families)
        return f'It is not a checkpoint of a model deepvit_mm knows ({names})'

    def load_pretrained(self, path: str, checkpoint_key: Optional[str] = None) -> LoadReport:
        """Load ``path`` (a file, ``~/...`` or an ``http(s)://`` URL, in any supported format and
        layout) through ``deepvit_mm.checkpoints.load_weights``; log and return the report.

        Args:
            path (str): The checkpoint.
            checkpoint_key (str, optional): The part to take, e.g. ``'student'`` of a DINO
                training checkpoint (default: its ``teacher``).
        """
        return load_weights(self, read_checkpoint(path), source=repr(path),
                            checkpoint_key=checkpoint_key)
