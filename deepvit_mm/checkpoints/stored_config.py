"""Keeps mmengine from evaluating code that a checkpoint stores as its config text.

mmengine's ``Runner.resume`` evaluates ``meta['config']`` whatever config the run is given, and its
inferencers given no config evaluate ``meta['cfg']`` or ``message_hub.runtime_info.cfg``. Such text
is kept only when it is plain data (assignments of literals and ``dict(...)``, what mmengine's
``Config.pretty_text`` writes); otherwise it is replaced by a config that stops with a message
saying how to proceed (``load_from=CKPT``, the config file given explicitly, or trusting the file).
"""
import ast
import sys
from typing import Mapping, Optional

from .trust import trust_hint

__all__ = []

# where mmengine (Runner.resume) and its inferencers (given no config) evaluate stored text
_CONFIG_TEXT_PLACES = (('meta', 'config'), ('meta', 'cfg'), ('message_hub', 'runtime_info', 'cfg'))


def _literal_problem(node: ast.AST) -> Optional[str]:
    """None if ``node`` is plain data (literals, containers, ``dict(k=...)``), else what it is."""
    if isinstance(node, ast.Constant):
        return None
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return next(filter(None, map(_literal_problem, node.elts)), None)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            return f'dict unpacking at line {node.lineno}'
        return next(filter(None, map(_literal_problem, [*node.keys, *node.values])), None)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _literal_problem(node.operand)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'dict' \
            and all(isinstance(a, ast.Dict) for a in node.args) and len(node.args) <= 1 \
            and all(kw.arg is not None for kw in node.keywords):
        # dict(k=v) and dict({'non-identifier key': v}), as Config.pretty_text writes them
        return next(filter(None, (_literal_problem(n) for n in
                                  [*node.args, *(kw.value for kw in node.keywords)])), None)
    return f'{type(node).__name__} at line {getattr(node, "lineno", "?")}: {ast.unparse(node)[:60]}'


def _literal_value(node: ast.AST):
    """The value of a node ``_literal_problem`` accepted (``dict(k=v)`` calls included)."""
    if isinstance(node, ast.Call):
        return {**(_literal_value(node.args[0]) if node.args else {}),
                **{kw.arg: _literal_value(kw.value) for kw in node.keywords}}
    if isinstance(node, ast.Dict):
        return {_literal_value(k): _literal_value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_literal_value(e) for e in node.elts]
    return ast.literal_eval(node)


def config_text_problem(text: str) -> Optional[str]:
    """None if a stored config text is plain data that mmengine can evaluate without running
    anything of the checkpoint's: top-level assignments of literals and ``dict(...)`` (what
    mmengine's ``Config.pretty_text`` writes), no ``_base_``, and ``custom_imports`` only of
    modules already imported. Otherwise a short description of the first offending statement."""
    if not isinstance(text, str):
        return f'a {type(text).__name__}, not text'
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        return f'not valid Python ({e.msg} at line {e.lineno})'
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            return f'{type(stmt).__name__} statement at line {stmt.lineno}: {ast.unparse(stmt)[:60]}'
        name = stmt.targets[0].id
        if name in ('dict', '_base_') or name.startswith('__'):
            return f'assignment to {name!r} at line {stmt.lineno}'
        problem = _literal_problem(stmt.value)
        if problem:
            return problem
        if name == 'custom_imports':
            value = _literal_value(stmt.value)
            imports = value.get('imports', []) if isinstance(value, dict) else value
            imports = [imports] if isinstance(imports, str) else imports
            new = [m for m in imports if not isinstance(m, str) or m not in sys.modules]
            if new:
                return f'custom_imports of modules not imported yet: {", ".join(new)}'
    return None


def _refusing_config(where: str, problem: str, path: str, resume: bool) -> str:
    """Config text that stops evaluation with our message (it is ours, not the checkpoint's).
    ``resume``: the text mmengine's ``Runner.resume`` evaluates (``meta['config']``), whatever
    config the run was given; else the one inferencers evaluate when given no config."""
    if resume:
        remedy = ('mmengine evaluates it on --resume whatever config you give. To start from '
                  'these weights without resuming, use load_from=CKPT (or --cfg-options '
                  'load_from=CKPT) instead of --resume.')
    else:
        remedy = ('Give the config file explicitly: DetInferencer(model=CONFIG, weights=CKPT) or '
                  'init_detector(CONFIG, CKPT) (mmdet), MMSegInferencer(model=CONFIG, '
                  'weights=CKPT) or init_model(CONFIG, CKPT) (mmseg).')
    msg = (f'deepvit_mm did not evaluate the config text stored in checkpoint {path!r} '
           f'({where}): it is not plain data ({problem}). {remedy} ' + trust_hint(path))
    return f'raise RuntimeError({msg!r})\n'


def neutralise_config_text(obj: dict, path: str) -> None:
    """Replace, in place, each config text mmengine would evaluate (``meta['config']``,
    ``meta['cfg']``, ``message_hub.runtime_info.cfg``) that is not plain data by one that stops
    with our message."""
    for place in _CONFIG_TEXT_PLACES:
        holder = obj
        for key in place[:-1]:
            holder = holder.get(key) if isinstance(holder, Mapping) else None
        if not isinstance(holder, dict) or place[-1] not in holder:
            continue
        problem = config_text_problem(holder[place[-1]])
        if problem:
            where = "checkpoint['" + "']['".join(place) + "']"
            holder[place[-1]] = _refusing_config(where, problem, path,
                                                  resume=place == ('meta', 'config'))
