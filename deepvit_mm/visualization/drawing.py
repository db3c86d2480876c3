"""What the feature-map and the attention tools share: the images they read, a config's network
input made of one, the labels they draw, and mmengine's ``Visualizer`` writing the pictures (and
their arrays beside them)."""
import os
import os.path as osp
import time
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ['VisualizationError', 'list_images', 'read_image', 'check_alpha', 'network_input',
           'draw_label', 'drawing_visualizer', 'write_pictures']

# mmengine's / mmdet's image suffixes (a folder's images are the files that end in one)
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')


class VisualizationError(ValueError):
    """Input the visualization tools cannot draw: the message, one line, says what to give."""


def list_images(inputs) -> List[str]:
    """The image files of ``inputs`` (a path or paths), each read (``read_image``): a file, or a
    folder's files ending in ``IMAGE_EXTENSIONS`` (sorted; not its subfolders').

    Raises:
        VisualizationError: a path that does not exist, a folder without image files, a file
            that is not an image.
    """
    files = []
    for path in [inputs] if isinstance(inputs, str) else [str(i) for i in inputs]:
        if not osp.isdir(path):
            if not osp.isfile(path):
                raise VisualizationError(f'image not found: {path!r}: give an image file or a '
                                         'folder')
            files.append(path)
            continue
        found = sorted(osp.join(path, f) for f in os.listdir(path)
                       if f.lower().endswith(IMAGE_EXTENSIONS) and osp.isfile(osp.join(path, f)))
        if not found:
            raise VisualizationError(f'no image in {path!r} (files ending in '
                                     f'{", ".join(IMAGE_EXTENSIONS)})')
        files += found
    for f in files:  # every image readable before a model is built or anything written
        read_image(f)
    return files


def read_image(path: str) -> np.ndarray:
    """An image file as the test pipelines load it (``mmcv.imread``: BGR, 3 channels).

    Raises:
        VisualizationError: the file cannot be decoded as an image.
    """
    import mmcv
    try:
        img = mmcv.imread(path)
    except Exception as e:  # mmcv raises on unreadable files and returns None on undecodable bytes
        raise VisualizationError(f'cannot read image {path!r}: {e}') from None
    if img is None or img.size == 0:
        raise VisualizationError(f'cannot read image {path!r}: not an image file OpenCV decodes')
    return img


def check_alpha(alpha: float) -> None:
    """Refuse a map's weight over the image outside [0, 1] (``--alpha``)."""
    if not 0 <= alpha <= 1:
        raise VisualizationError(f'--alpha {alpha}: give a weight in [0, 1]')


def network_input(inferencer, image: np.ndarray) -> Tuple[object, dict]:
    """An image (BGR) as the inferencer's model takes it: its test pipeline (without annotations)
    and data preprocessor; the input batch and the image's ``metainfo`` (``img_shape``...)."""
    from mmengine.dataset import pseudo_collate
    data = pseudo_collate([inferencer.pipeline(image)])
    data = inferencer.model.data_preprocessor(data, False)
    return data['inputs'], data['data_samples'][0].metainfo


def draw_label(vis, image: np.ndarray, text: str,
               xy: Optional[Tuple[float, float]] = None) -> np.ndarray:
    """``text`` in the top-left corner of ``image`` (RGB), drawn by the visualizer ``vis``; at
    ``xy`` a cross (a query's pixel)."""
    vis.set_image(image)
    size = max(7, min(image.shape[:2]) // (14 + 4 * text.count('\n')))  # more lines: smaller
    vis.draw_texts(text, np.array([2, 2]), colors='white', font_sizes=size,
                   vertical_alignments='top',
                   bboxes=dict(facecolor='black', alpha=0.6, pad=1, edgecolor='none'))
    if xy is not None:
        vis.draw_points(np.array([xy]), colors='white', marker='x',
                        sizes=np.array([max(16, size * 3)]))
    return vis.get_image()


def drawing_visualizer():
    """An mmengine ``Visualizer`` of its own that draws and writes nothing."""
    from mmengine.visualization import Visualizer
    # a name of its own: mmengine returns an existing visualizer of the same name, unchanged
    return Visualizer(name=f'draw_{time.time_ns()}')


def _writer(out_dir: str, backends: Optional[Sequence[dict]]):
    """mmengine's ``Visualizer`` writing to ``backends`` (vis backend configs), a local one into
    ``out_dir`` added where there is none (TensorBoard's files go under ``out_dir/vis_data``)."""
    from mmengine.visualization import Visualizer
    cfgs = [dict(b) for b in backends or []]
    for b in cfgs:
        b['type'] = str(b['type']).split('.')[-1]  # mmengine's own registry has them all
    if not any(b['type'] == 'LocalVisBackend' for b in cfgs):
        cfgs.append(dict(type='LocalVisBackend'))
    for b in cfgs:
        if b['type'] == 'LocalVisBackend':
            b.update(save_dir=out_dir, img_save_dir='.')
    return Visualizer(name=f'writer_{time.time_ns()}', vis_backends=cfgs, save_dir=out_dir)


def write_pictures(files: Sequence[str], pictures: Callable[[str], list], out_dir: str,
                   backends: Optional[Sequence[dict]], save_arrays: bool) -> List[str]:
    """Write the pictures of each image file, ``pictures(path)``: ``(name, picture, arrays)``,
    as ``out_dir/<name>_0.png`` through ``backends`` (e.g. a config's
    ``visualizer.vis_backends``; a local one into ``out_dir`` always) and, with ``save_arrays``,
    ``arrays()`` as ``out_dir/<name>_0.npz``. Nothing is written before the first image's
    pictures are drawn. Returns the files written (each PNG, then its ``.npz``)."""
    writer, written = None, []
    for path in files:
        drawn = pictures(path)
        writer = writer or _writer(out_dir, backends)
        for name, picture, arrays in drawn:
            writer.add_image(name, picture, step=0)
            written.append(osp.join(out_dir, f'{name}_0.png'))
            if save_arrays:
                written.append(osp.join(out_dir, f'{name}_0.npz'))
                np.savez(written[-1], **arrays())
    if writer is not None:
        writer.close()
    return written
