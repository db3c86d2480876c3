"""The model-zoo page (configs/README.md), written from model-index.yml and metafiles/.

``python tools/model_zoo.py`` rewrites the page; the tests check that it is what this writes.
"""
import os

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, 'configs', 'README.md')

_HEADER = """\
# Model zoo

Every recipe in this folder, with its #params and GFLOPs (multiply-adds of one inference forward
at 800×1344 for detection, 512×512 for segmentation; UperNet's auxiliary head counts in #params
only) as `python tools/analysis/get_flops.py CONFIG` counts them, and the result reported for the
model where there is one: the XCiT paper's (ImageNet-1k pretraining, trained with the official
code) with the official checkpoint, which loads here as it is (`python tools/test.py CONFIG URL`);
ViTDet's (its model zoo); for BEiT's UperNet, mmseg's (the published config it follows). These
configs have not reproduced the numbers themselves; they train what the official configs trained
([docs/training.md](../docs/training.md#the-recipes-and-the-official-xcit-configs)), the ViTDet
recipe with the deviations its header lists.

The same entries are in `model-index.yml` and `metafiles/` (`mim search deepvit_mm`). This page is
written from them by `python tools/model_zoo.py`.
"""



def _models():
    with open(os.path.join(ROOT, 'model-index.yml')) as f:
        index = yaml.safe_load(f)
    for rel in index['Import']:
        with open(os.path.join(ROOT, rel)) as f:
            meta = yaml.safe_load(f)
        yield meta['Collections'][0]['Name'], meta['Models']


def _metrics(model: dict) -> list:
    values = {}
    for result in model.get('Results', []):
        values.update(result['Metrics'])
    return values


def _row(model: dict, metric_names: list) -> str:
    meta = model['Metadata']
    config = os.path.relpath(os.path.join(ROOT, model['Config']), os.path.dirname(PAGE))
    values = _metrics(model)
    paper = ' / '.join(str(values[m]) for m in metric_names) if values else ''
    weights = f"[model]({model['Weights']})" if 'Weights' in model else ''
    return (f"| [{os.path.basename(config)}]({config}) | {meta['Backbone']} | "
            f"{meta['Parameters'] / 1e6:.1f}M | {meta['FLOPs'] / 1e9:.1f} | {paper} | {weights} |")


def page() -> str:
    """The page's whole text."""
    out = [_HEADER]
    for collection, models in _models():
        metric_names = []
        for m in models:
            for name in _metrics(m):
                if name not in metric_names:
                    metric_names.append(name)
        header = ' / '.join(metric_names) if metric_names else 'result'
        out.append(f'## {collection}\n')
        out.append(f'| config | backbone | #params | GFLOPs | reported {header} | official weights |')
        out.append('|---|---|---:|---:|---|---|')
        out.extend(_row(m, metric_names) for m in models)
        out.append('')
    return '\n'.join(out)


def write(path: str = PAGE) -> None:
    with open(path, 'w') as f:
        f.write(page())
