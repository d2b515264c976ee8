"""Registry: name -> attention core or sequence mixer class, and its options.

The one place names are resolved and the one place a core's options come
from. A core is found by its module's name: `get_core_class('longformer')`
imports models/attention/longformer.py (or models/mixers/longformer.py),
whose `@register('longformer')` records the class. A module may register
under another name; a name not found that way, and `known_cores()`, import
every module of both packages (pkgutil). Modules that register nothing
(base.py, relative.py, ...) are imported and ignored.

Two kinds share the registry (the `is_mixer` flag of the class):
  attention core: (q, k, v, mask) -> out, built with the common arguments
    ATTENTION_ARGS (num_heads, head_dim, max_length, dropout_rate, dtype,
    rngs, layer_index) by `build`;
  sequence mixer (models/mixers/base.py): (x, mask) -> y, built with
    MIXER_ARGS (emb_dim instead of head_dim) by `build_mixer`.
Every other keyword of the constructor is an option: `options_of(name)`
gives them with their defaults (inspect.signature), and lra/train/options.py
puts all of them in `model.attention`, so each can be set from the command
line (--config.model.attention.<option>=<value>).
"""

import importlib
import inspect
import pkgutil

from models.errors import UserError

PACKAGES = ('models.attention', 'models.mixers')
ATTENTION_ARGS = (
  'num_heads',
  'head_dim',
  'max_length',
  'dropout_rate',
  'dtype',
  'rngs',
  'layer_index',
)
MIXER_ARGS = (
  'emb_dim',
  'num_heads',
  'max_length',
  'dropout_rate',
  'dtype',
  'rngs',
  'layer_index',
)

_CORES = {}


def register(name):
  def wrap(cls):
    if name in _CORES and _CORES[name] is not cls:
      raise ValueError(f'attention core {name!r} registered twice')
    _CORES[name] = cls
    cls.registry_name = name
    return cls

  return wrap


def _import(module):
  """Imports `module`; False when it (or its package) does not exist. An
  import error inside an existing module is raised, not hidden."""
  try:
    importlib.import_module(module)
    return True
  except ModuleNotFoundError as e:
    if e.name and (module == e.name or module.startswith(e.name + '.')):
      return False
    raise


def _load_all():
  for package in PACKAGES:
    if not _import(package):
      continue
    path = importlib.import_module(package).__path__
    for info in pkgutil.iter_modules(path):
      _import(f'{package}.{info.name}')


def known_cores():
  """Every registered name (attention cores and mixers), sorted."""
  _load_all()
  return tuple(sorted(_CORES))


def get_core_class(name):
  """The class registered as `name`: its module is imported on first use."""
  if name not in _CORES and isinstance(name, str) and name.isidentifier():
    for package in PACKAGES:
      if _import(f'{package}.{name}') and name in _CORES:
        break
  if name not in _CORES:
    _load_all()
  if name not in _CORES:
    raise UserError(
      f'Unknown attention core {name!r}; known cores: '
      f'{", ".join(known_cores())}.'
    )
  return _CORES[name]


def is_mixer(cls):
  """True for a sequence mixer (models/mixers/base.py), False for a core."""
  return bool(getattr(cls, 'is_mixer', False))


def common_args(cls):
  """The arguments the builder passes (not options of the core)."""
  return MIXER_ARGS if is_mixer(cls) else ATTENTION_ARGS


def option_parameters(name):
  """{option: inspect.Parameter} of the core `name`'s own options, in the
  constructor's order (annotations evaluated when they can be)."""
  cls = get_core_class(name)
  try:
    signature = inspect.signature(cls.__init__, eval_str=True)
  except (NameError, SyntaxError, TypeError):
    signature = inspect.signature(cls.__init__)
  common = common_args(cls)
  out = {}
  for i, p in enumerate(signature.parameters.values()):
    if i == 0 or p.name in common:
      continue  # self, and what the builder passes
    if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
      continue
    if p.default is p.empty:
      raise ValueError(
        f'{cls.__name__} option {p.name!r} has no default; every option of '
        'a registered core needs one (model.attention is filled from them).'
      )
    out[p.name] = p
  return out


def options_of(name):
  """{option: default} of the core `name`: THE list of the keys its
  `model.attention` block may have (besides 'name')."""
  return {k: p.default for k, p in option_parameters(name).items()}


def shown(value):
  """A value as it is written on the command line (strings unquoted, a
  tuple or list as a comma list)."""
  if isinstance(value, (tuple, list)):
    return ','.join(shown(v) for v in value) or "''"
  if isinstance(value, str):
    return value if value else "''"
  return repr(value)


def _items(value):
  """The items of a list option's value: a tuple or list, a comma-list
  string (a config saved before such options were tuples), else one."""
  if isinstance(value, str):
    return [p for p in value.split(',') if p.strip()] or [value]
  if isinstance(value, (tuple, list)):
    return list(value)
  return [value]


def check_per_layer(options, num_layers):
  """Raises UserError (one sentence) when a per-layer option of the core
  (its class's `per_layer_options`, e.g. longformer's window) lists more
  than one value but not one per layer (num_layers)."""
  cls = get_core_class(options['name'])
  for key in getattr(cls, 'per_layer_options', ()):
    items = _items(options.get(key))
    if len(items) <= 1 or len(items) == num_layers:
      continue
    fixed = [str(x).strip() for x in items[:num_layers]]
    while len(fixed) < num_layers:  # longer: double the last, as an example
      try:
        fixed.append(str(2 * int(fixed[-1])))
      except ValueError:
        fixed.append(fixed[-1])
    raise UserError(
      f'{options["name"]} {key} lists {len(items)} values, one per layer '
      f'({shown(tuple(items))}), but the model has '
      f'{num_layers} layer{"s" * (num_layers != 1)} (model.num_layers); '
      f'give one per layer, e.g. --config.model.attention.{key}='
      f'{",".join(fixed)}, or a single value.'
    )


def options_text(name):
  """'window=512, dilation=1, ...' of the core `name`, or 'none'."""
  options = options_of(name)
  return ', '.join(f'{k}={shown(v)}' for k, v in options.items()) or 'none'


def unknown_option_sentence(name, option, suggestion=None):
  """One sentence: the core `name` has no `option`, and what it has."""
  hint = f' (did you mean {suggestion!r}?)' if suggestion else ''
  if not options_of(name):
    return f'{name} has no option {option!r}{hint}; it has no options.'
  return (
    f'{name} has no option {option!r}{hint}; its options: '
    f'{options_text(name)} (set one with '
    '--config.model.attention.<option>=<value>).'
  )


def check_options(options):
  """Raises UserError when the `model.attention` block `options` has a key
  its core does not take (unknown_option_sentence)."""
  name = options['name']
  known = options_of(name)
  for key in options:
    if key != 'name' and key not in known:
      raise UserError(unknown_option_sentence(name, key))


def _build(kind, options, common):
  options = dict(options)
  name = options['name']
  cls = get_core_class(name)
  if is_mixer(cls) and kind != 'mixer':
    raise UserError(
      f'{name!r} is a sequence mixer (models/mixers/), not an attention '
      'core; registry.build_mixer builds it.'
    )
  if kind == 'mixer' and not is_mixer(cls):
    raise UserError(
      f'{name!r} is an attention core, not a sequence mixer; registry.build '
      'builds it.'
    )
  check_options(options)
  del options['name']
  return cls(**common, **options)


def build(
  options,
  *,
  num_heads,
  head_dim,
  max_length,
  dropout_rate,
  dtype,
  rngs,
  layer_index=0,
):
  """Builds the attention core named by options['name'] with the rest as
  its options (missing ones take their defaults).

  layer_index: the block's index in the encoder, for cores whose random
  layout is a function of (seed, layer, head) (BigBird, Reformer).
  """
  return _build(
    'attention',
    options,
    dict(
      num_heads=num_heads,
      head_dim=head_dim,
      max_length=max_length,
      dropout_rate=dropout_rate,
      dtype=dtype,
      rngs=rngs,
      layer_index=layer_index,
    ),
  )


def build_mixer(
  options,
  *,
  emb_dim,
  num_heads,
  max_length,
  dropout_rate,
  dtype,
  rngs,
  layer_index=0,
):
  """Builds the sequence mixer (models/mixers/) named by options['name']
  with the rest as its options (missing ones take their defaults)."""
  return _build(
    'mixer',
    options,
    dict(
      emb_dim=emb_dim,
      num_heads=num_heads,
      max_length=max_length,
      dropout_rate=dropout_rate,
      dtype=dtype,
      rngs=rngs,
      layer_index=layer_index,
    ),
  )
