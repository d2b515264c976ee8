"""The documentation of every config field: the `# ...` comments above the
field's assignment in configs/base.py and in the task file, read from their
source (ast + tokenize), and `train.py --print_config`'s text. The files
are found where the configs package is (lra/train/config.py), in a checkout
or installed.

A field's comment is, in this order of preference:
  the comment lines directly above its assignment (or the comment at the
    end of its line) in the task file, then in the configs modules the task
    file imports (configs/pathx.py imports configs/pathfinder.py), then in
    configs/base.py;
  else the comment of the assignment just above it with no blank line in
    between (`c.adam_b1`, `c.adam_b2`, `c.adam_eps` under one comment),
    base.py first.
An option of the attention core (model.attention.<option>) comes from the
core's constructor: its comment names the core's module, whose docstring
documents it. A field with no comment is printed alone.
"""

import ast
import inspect
import io
import os
import tokenize

import ml_collections

from lra.train import config as config_loader

CONFIGS_DIR = config_loader.configs_dir()
# Files are shown relative to the folder that holds configs/ and models/.
ROOT = os.path.dirname(CONFIGS_DIR)
BASE_FILE = os.path.join(CONFIGS_DIR, 'base.py')
# Names that hold the config itself in the config files.
ROOTS = ('c', 'config')


def _comments(source):
  """({line: comment text} of the comment-only lines, {line: comment text}
  of the comments after code), lines counted from 1."""
  alone, inline = {}, {}
  lines = source.splitlines()
  tokens = tokenize.generate_tokens(io.StringIO(source).readline)
  for tok in tokens:
    if tok.type != tokenize.COMMENT:
      continue
    row, col = tok.start
    text = tok.string.lstrip('#').strip()
    if lines[row - 1][:col].strip():
      inline[row] = text
    else:
      alone[row] = text
  return alone, inline


def _dotted(node, aliases):
  """'model.num_layers' of `c.model.num_layers` (an alias `m` of c.model
  is followed), or None when the chain is not rooted at the config."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name) or node.id not in aliases:
    return None
  prefix = aliases[node.id]
  return '.'.join(filter(None, [prefix, *reversed(parts)]))


def _assignments(tree):
  """(dotted key, first line, last line) of every assignment to a config
  field, in source order; aliases (`m = c.model`, `d = c.data`) are
  followed within their function."""
  out = []

  def visit(body, aliases):
    for node in body:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        visit(node.body, {r: '' for r in ROOTS})
        continue
      if isinstance(node, ast.Assign):
        keys, names = [], []
        for target in node.targets:
          elements = (
            target.elts
            if isinstance(target, (ast.Tuple, ast.List))
            else [target]
          )
          for t in elements:
            key = _dotted(t, aliases)
            if key is not None:
              keys.append(key)
            elif isinstance(t, ast.Name):
              names.append(t.id)
        source = _dotted(node.value, aliases)
        if source is None and keys:
          source = keys[0]  # m = c.model = ConfigDict()
        for name in names:
          if source is not None:
            aliases[name] = source
          else:
            aliases.pop(name, None)
        for key in keys:
          out.append((key, node.lineno, node.end_lineno))
      for field in ('body', 'orelse', 'finalbody'):
        inner = getattr(node, field, None)
        if inner and not isinstance(node, ast.FunctionDef):
          visit(inner, aliases)

  visit(tree.body, {r: '' for r in ROOTS})
  return out


def read_comments(path):
  """({key: direct comment}, {key: inherited comment}) of one config file
  (module docstring)."""
  with open(path) as f:
    source = f.read()
  alone, inline = _comments(source)
  direct, inherited = {}, {}
  previous = None  # (last line, comment) of the assignment above
  for key, first, last in _assignments(ast.parse(source)):
    lines, row = [], first - 1
    while row in alone:
      lines.append(alone[row])
      row -= 1
    text = ' '.join(reversed(lines))
    if text or inline.get(first):
      direct.setdefault(key, text or inline[first])
    elif previous and previous[0] == first - 1:
      text = previous[1]
      inherited.setdefault(key, text)
    # A comment above is shared with the lines below it; one at the end of
    # a line is that line's own.
    previous = (last, text) if text else None
  return direct, inherited


def imported_configs(path):
  """The configs modules a config file imports (`from configs import
  pathfinder`), as file paths, base.py and models.py left out."""
  with open(path) as f:
    tree = ast.parse(f.read())
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module == 'configs':
      for alias in node.names:
        file = os.path.join(CONFIGS_DIR, f'{alias.name}.py')
        if alias.name not in ('base', 'models') and os.path.exists(file):
          out.append(file)
  return out


def field_comments(task_file):
  """{dotted key: comment} of the fields set in `task_file` and in
  configs/base.py (module docstring for the order of preference)."""
  files = [task_file, *imported_configs(task_file), BASE_FILE]
  files = list(dict.fromkeys(os.path.abspath(f) for f in files))
  read = [read_comments(f) for f in files]
  out = {}
  for direct, _ in read:
    for key, text in direct.items():
      out.setdefault(key, text)
  for _, inherited in reversed(read):
    for key, text in inherited.items():
      out.setdefault(key, text)
  return out


def _source_order(task_file):
  """{dotted key: rank} in the order the fields are first set (base.py,
  then the task file)."""
  order = {}
  for path in (BASE_FILE, *imported_configs(task_file), task_file):
    with open(path) as f:
      for key, _, _ in _assignments(ast.parse(f.read())):
        order.setdefault(key, len(order))
  return order


def _core(name):
  """(the core `name`'s option names in constructor order, its module's
  path from the project root), or ((), None) when it is unknown."""
  from models.attention import registry  # pylint: disable=g-import-not-at-top

  try:
    cls = registry.get_core_class(name)
    module = os.path.relpath(inspect.getsourcefile(cls), ROOT)
    return tuple(registry.options_of(name)), module
  except Exception:  # pylint: disable=broad-except
    return (), None


def _leaves(config, prefix=''):
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _leaves(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}', value


def _wrapped(text, width=78):
  """`text` as '# ' lines of at most `width` characters."""
  lines, line = [], ''
  for word in text.split():
    if line and len(line) + 1 + len(word) > width - 2:
      lines.append(line)
      line = word
    else:
      line = f'{line} {word}' if line else word
  return [f'# {ln}' for ln in [*lines, line] if ln]


def config_text(config, task_file, spec=''):
  """Every field of `config` as `dotted.key = value` (Python literals),
  each under its comment (field_comments; fields that share one comment
  under it once), in the order the config files set them (a nested field
  after its parent; model.attention's name, then its core's options in the
  constructor's order); `spec` (the --config argument) heads the text."""
  comments = field_comments(task_file)
  order = _source_order(task_file)
  block = config.get('model', {}).get('attention', {})
  options, module = _core(block.get('name'))
  option_rank = {'name': -1, **{k: i for i, k in enumerate(options)}}
  late = len(order) + len(option_rank)

  def rank(key):
    parts = key.split('.')
    out = []
    for i in range(1, len(parts) + 1):
      prefix = '.'.join(parts[:i])
      if prefix in order:
        out.append(order[prefix])
      elif prefix.startswith('model.attention.') and i == len(parts):
        out.append(option_rank.get(parts[-1], late))
      else:
        out.append(late)
    return out, key

  head = f'The resolved config of {spec}' if spec else 'The resolved config'
  files = [BASE_FILE, *imported_configs(task_file), task_file]
  files = ', '.join(os.path.relpath(f, ROOT) for f in dict.fromkeys(files))
  out = _wrapped(
    f'{head}, locked: set a field with --config.<key>=<value>. Each field is '
    f'documented by the comment above it in {files}.'
  )
  last = out  # no comment is this: the first field opens a group
  for key, value in sorted(_leaves(config), key=lambda kv: rank(kv[0])):
    text = comments.get(key)
    if key == 'model.attention.name':
      text = text or comments.get('model.attention')
    elif text is None and module and key.startswith('model.attention.'):
      text = (
        f'An option of the {block.get("name")} core, documented in its '
        f'module docstring ({module}).'
      )
    if text != last:  # a group of fields: one comment, no blank line
      out += ['', *(_wrapped(text) if text else [])]
    out.append(f'{key} = {value!r}')
    last = text
  return '\n'.join(out) + '\n'
