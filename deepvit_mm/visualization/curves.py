"""Training curves from mmengine's scalar log: the losses and the held-out metrics against
iterations.

mmengine's ``LocalVisBackend`` writes ``<work_dir>/<timestamp>/vis_data/scalars.json``, one JSON
object a line: a training line every ``LoggerHook`` interval (``lr``, ``loss``, ``loss_*``,
``time``, ``iter``, ``step``: the iteration) and a validation line after each evaluation (the
metrics, e.g. mmdet's ``coco/bbox_mAP`` or mmseg's ``mIoU``). A validation line's ``step`` is the
iteration only where the config's ``LoggerHook`` has ``log_metric_by_epoch=False`` (mmseg's
iteration-based configs); by default it is the epoch (0 all through an iteration-based run), so a
validation line is placed at the iteration of the training line before it unless its own step
is later. mmdet's and mmseg's ``tools/analysis_tools/analyze_logs.py plot_curve`` read the same file
(docs/visualization.md); this draws both kinds in one picture, with matplotlib's Agg canvas (no
display, no pyplot state).
"""
import glob
import json
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ['find_scalars', 'read_scalars', 'plot_curves']

# keys of a log line that are bookkeeping, not a loss or a metric
_BOOKKEEPING = {'lr', 'base_lr', 'momentum', 'data_time', 'time', 'iter', 'epoch', 'step',
                'memory'}

# a series: the iterations (steps) and the values
Series = Tuple[List[float], List[float]]


class Scalars:
    """The series of a ``scalars.json``: ``train[key]`` and ``val[key]``, each ``(steps,
    values)``; ``path`` the file."""

    def __init__(self, path: str, train: Dict[str, Series], val: Dict[str, Series]):
        self.path, self.train, self.val = path, train, val

    @property
    def losses(self) -> List[str]:
        """The training keys that are losses (``loss`` and ``loss_*``), ``loss`` first."""
        return sorted((k for k in self.train if k == 'loss' or k.startswith('loss_')),
                      key=lambda k: (k != 'loss', k))


def find_scalars(path: str) -> str:
    """``path`` itself if it is a file, else the newest ``*/vis_data/scalars.json`` under the
    folder ``path`` (a work dir; or a run's own folder) that has training lines (a training run's,
    not an evaluation's).

    Raises:
        FileNotFoundError: nothing of the kind; the message says what to give.
    """
    if osp.isfile(path):
        return path
    if not osp.isdir(path):
        raise FileNotFoundError(f'{path!r} does not exist: give a scalars.json or a work dir')
    found = glob.glob(osp.join(path, 'vis_data', 'scalars.json')) + \
        glob.glob(osp.join(path, '*', 'vis_data', 'scalars.json'))
    for f in sorted(found, key=os.path.getmtime, reverse=True):
        if read_scalars(f).losses:
            return f
    raise FileNotFoundError(f'no training run under {path!r}: no <run>/vis_data/scalars.json with '
                            'losses (mmengine\'s LocalVisBackend writes it; is it in the config\'s '
                            'visualizer.vis_backends?)')


def read_scalars(path: str) -> Scalars:
    """Read mmengine's ``scalars.json``: a line with a learning rate or a loss is a training
    line, any other a validation line; each numeric key a series against the iterations: a
    training line's ``step``, a validation line's own where it is not before the last training
    line's, else that training line's (its ``step`` is an epoch: see the module's docstring).

    Raises:
        ValueError: a line that is not JSON, or has no ``step``; the message names the line.
    """
    train: Dict[str, Series] = {}
    val: Dict[str, Series] = {}
    last_train = 0.0
    with open(path, encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                step = float(row['step'])
            except (ValueError, KeyError, TypeError):
                raise ValueError(f'{path}:{n}: not a line of mmengine\'s scalars.json (one JSON '
                                 'object with a "step" a line)') from None
            if 'lr' in row or any(k.startswith('loss') for k in row):
                kind, last_train = train, step
            else:
                kind, step = val, max(step, last_train)
            for key, value in row.items():
                if key in _BOOKKEEPING or isinstance(value, bool) or \
                        not isinstance(value, (int, float)):
                    continue
                steps, values = kind.setdefault(key, ([], []))
                steps.append(step)
                values.append(float(value))
    return Scalars(path, train, val)


def default_metrics(scalars: Scalars) -> List[str]:
    """The held-out metrics drawn by default: the mAPs without a size or IoU suffix (mmdet's
    ``coco/bbox_mAP``, ``coco/segm_mAP``), mmseg's ``mIoU``; else every validation key."""
    keys = [k for k in scalars.val if k.endswith('mAP') or k.split('/')[-1] == 'mIoU']
    return keys or list(scalars.val)


def _check_keys(scalars: Scalars, losses: List[str], metrics: List[str]) -> None:
    """Refuse a key the log does not have (naming those it has), or no loss."""
    for keys, have, what in ((losses, scalars.train, 'training'), (metrics, scalars.val,
                                                                   'validation')):
        missing = [k for k in keys if k not in have]
        if missing:
            raise ValueError(f'{scalars.path} has no {what} key {", ".join(missing)}: it has '
                             f'{", ".join(sorted(have)) or "none"}')
    if not losses:
        raise ValueError(f'{scalars.path} has no loss: is it a training run\'s scalars.json?')


def plot_curves(scalars: Scalars, out: str, losses: Optional[Sequence[str]] = None,
                metrics: Optional[Sequence[str]] = None, title: Optional[str] = None,
                dpi: int = 100) -> str:
    """Draw the losses (left) and the held-out metrics (right) against iterations into the
    image file ``out`` (its suffix says the format: .png, .pdf, .svg).

    Args:
        scalars (Scalars): From ``read_scalars``.
        out (str): The file written (its folder is made).
        losses (Sequence[str], optional): Training keys. Default: every loss.
        metrics (Sequence[str], optional): Validation keys. Default: ``default_metrics``; the
            right panel is left out where there are none.
        title (str, optional): Above the picture. Default: the log's path.
        dpi (int): Dots per inch of a raster file (the picture is 10 x 3.6 inches).

    Returns:
        str: ``out``.

    Raises:
        ValueError: a key the log does not have (the message lists those it has), or no loss.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    losses = list(losses) if losses else scalars.losses
    metrics = list(metrics) if metrics is not None else default_metrics(scalars)
    _check_keys(scalars, losses, metrics)
    fig = Figure(figsize=(10, 3.6), dpi=dpi, layout='constrained')
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2 if metrics else 1, squeeze=False)[0]
    for key in losses:
        axes[0].plot(*scalars.train[key], label=key, linewidth=1)
    axes[0].set(xlabel='iteration', ylabel='loss', title='training losses')
    axes[0].legend(fontsize='small')
    axes[0].grid(alpha=0.3)
    if metrics:
        for key in metrics:
            axes[1].plot(*scalars.val[key], label=key, marker='o', linewidth=1)
        axes[1].set(xlabel='iteration', title='held-out metrics')
        axes[1].set_xlim(axes[0].get_xlim())
        axes[1].legend(fontsize='small')
        axes[1].grid(alpha=0.3)
    fig.suptitle(title if title is not None else scalars.path, fontsize='small')
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    fig.savefig(out)
    return out
