"""The key layouts the loader converts for a backbone (``ColumnarBackbone.convert_state_dict``,
its side of ``deepvit_mm.checkpoints.WeightsTarget``): ours, a detector's or segmentor's
(``backbone.``, the official XCiT detection code's ``fpn1..fpn4``), and the family's classification
releases, official and timm's; and the keys dropped on purpose.
"""
import re
from typing import Callable, Dict, List, Sequence

import torch

__all__ = []


def backbone_keys(state_dict: Dict[str, torch.Tensor],
                  convert_trunk_keys: Callable[[Dict[str, torch.Tensor]], Dict[str, torch.Tensor]]
                  ) -> Dict[str, torch.Tensor]:
    """Any supported layout -> a backbone's keys (``trunk.*``, ``adapter.*``); the trunk's part of
    a classification checkpoint through the family's ``convert_trunk_keys``.

    Accepts our own (``trunk.``/``adapter.``), a detector/segmentor checkpoint (``backbone.``
    prefix, ours or the official XCiT detection code's ``fpn1..fpn4``), official classification
    releases and timm's.
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
    trunk = convert_trunk_keys(rest)
    return {**{f'trunk.{k}': v for k, v in trunk.items()}, **adapter}


def unbuilt_key_patterns(classifier_parts: Sequence[str], kept_blocks: int,
                         depth: int) -> List[str]:
    """Regexes of converted keys a backbone never builds: the trunk's ``classifier_parts`` and
    its blocks after the first ``kept_blocks`` of ``depth``."""
    pats = [r'^trunk\.(' + '|'.join(classifier_parts) + r')(\.|$)']
    if kept_blocks < depth:
        pruned = '|'.join(str(i) for i in range(kept_blocks, depth))
        pats.append(rf'^trunk\.blocks\.({pruned})\.')
    return pats
