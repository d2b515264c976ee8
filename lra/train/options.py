"""Model names -> `model.attention` blocks, every core option typed for the
command line, and the checks of a config's attention block.

A model name is a registered core's name (models/attention/<name>.py or
models/mixers/<name>.py: the registry finds it, models/attention/
registry.py) with that core's defaults, unless MODELS below lists it as an
exception. `apply_model` (called by every task file through
configs/models.py) sets `config.model.attention` to EVERY option of the
core with its constructor default (registry.options_of), then the model's
MODELS entry, then MODEL_SETTINGS, then the model's own paper recipe for
the task (configs/models.py PAPER_RECIPES), then the task's tuned
MODEL_OVERRIDES (keyed dicts in the task files: configs/image.py,
configs/pathfinder.py). So any option of any core can be set with
--config.model.attention.<option>=<value>, an unknown one stops with one
sentence naming the core's options and their defaults, and config.json
records the effective options.

Option types follow the constructor: an option annotated with several
types (`global_tokens: int | str = 'auto'`) or defaulting to None takes any
of them from the command line (`=8` is the int 8, `=auto` the string;
`=None` where None is allowed); an option that takes a sequence
(`window: int | tuple[int, ...] = 512`) reads a comma list as a tuple of its
item type (`=8,16` is (8, 16); `=8` still the int 8); a plain default's type
is kept (booleans `=True`, `=False`). A per-layer list (a core's
`per_layer_options`, e.g. longformer's window) must have one item per layer
(model.num_layers): check_attention says so in one sentence.
"""

import dataclasses
import inspect
import re
import types
import typing

from absl import flags
import ml_collections
from ml_collections import config_flags

from models.attention import registry
from models.errors import UserError

# The exceptions: model name -> `model.attention` entries over its core's
# defaults. Every other registered core is a model of the same name.
MODELS = {
  # The exact softmax attention as LRA measured it: einsum, explicit L x L.
  'transformer': {'name': 'softmax', 'implementation': 'einsum'},
  # The same function without the L x L matrix. fused_kernel 'auto' asks
  # for cuDNN flash attention (jax.nn.dot_product_attention) on an NVIDIA
  # GPU in bfloat16 (--config.dtype=bfloat16), else the blocked
  # online-softmax path with its recomputing backward, O(L) memory
  # (models/attention/blocked.py; 'xla', 'cudnn': force one). It has no
  # attention dropout (MODEL_SETTINGS).
  'transformer_fused': {
    'name': 'softmax',
    'implementation': 'fused',
    'fused_kernel': 'auto',
  },
}
# Registered cores that are not model names, and why.
NOT_MODELS = {
  # Its models are transformer (einsum) and transformer_fused.
  'softmax': 'the core of the transformer and transformer_fused models',
  # benchmark.py's --ceiling (out = v, no token mixing): never trained.
  'none': "benchmark.py's --ceiling row, not a model",
}

# Model -> flattened settings outside `model.attention` that the model
# implies, applied before the task's tuned overrides and the presets.
MODEL_SETTINGS = {
  'transformer_fused': {'model.attention_dropout_rate': 0.0},
  # Segment recurrence (models/recurrent.py, model.segment_length): memory
  # of the previous segment (Transformer-XL), plus a compressed older memory
  # (Compressive Transformer), both with relative positions. Their 0 lengths
  # mean the defaults (memory = segment length, compressed memory = memory).
  'transformer_xl': {'model.positions': 'relative'},
  'compressive_transformer': {'model.positions': 'relative'},
}


def known_models():
  """Every model name: MODELS, then the registered cores by name."""
  cores = [
    n for n in registry.known_cores() if n not in NOT_MODELS and n not in MODELS
  ]
  return (*MODELS, *cores)


def _unknown_model(model_name):
  why = NOT_MODELS.get(model_name)
  hint = f' ({model_name!r} is {why})' if why else ''
  return ValueError(
    f'Unknown model {model_name!r}{hint}; known models: '
    f'{", ".join(known_models())}.'
  )


def model_entry(model_name):
  """The model's MODELS entry, {'name': <core>} for a core's own name;
  ValueError naming the known models for anything else."""
  if model_name in MODELS:
    return dict(MODELS[model_name])
  if not isinstance(model_name, str) or model_name in NOT_MODELS:
    raise _unknown_model(model_name)
  try:
    registry.get_core_class(model_name)
  except UserError:
    raise _unknown_model(model_name) from None
  return {'name': model_name}


def core_of(model_name):
  """The registry name of the model's core."""
  return model_entry(model_name)['name']


def is_mixer_model(config):
  """Whether the config's model.attention is a sequence mixer
  (models/mixers/), not an attention core."""
  name = config.model.attention.name
  return registry.is_mixer(registry.get_core_class(name))


def attention_defaults(model_name):
  """The model's `model.attention` block as a dict: 'name', every option of
  its core with its default, the model's MODELS entry over them."""
  entry = model_entry(model_name)
  name = entry['name']
  registry.check_options(entry)
  return {'name': name, **registry.options_of(name), **entry}


def changed_options(config, reference=None):
  """{option: value} of config.model.attention that differ from the model's
  default (attention_defaults of config.model_name: the core's defaults and
  its MODELS entry; a task's tuned value, e.g. image bigbird's block_size=64,
  counts as changed), or from `reference`'s block when given (a config or a
  dict of the same form). 'name' is in it when the core was changed."""
  if reference is None:
    defaults = attention_defaults(config['model_name'])
  else:
    defaults = dict(reference['model']['attention'])
  block = dict(config['model']['attention'])
  missing = object()
  out = {}
  for key, value in block.items():
    default = defaults.get(key, missing)
    if default is missing and key != 'name':
      # Saved before the option existed: it ran with the core's default.
      default = registry.options_of(block['name']).get(key, missing)
    if value != default:
      out[key] = value
  return out


# ------------------------------------------------------------ option types
_NONE = type(None)
# Types config_flags parses, in the order a command-line string is tried.
_SIMPLE = (_NONE, bool, int, float, str)
_UNION_TYPES = {}


@dataclasses.dataclass(frozen=True)
class _TupleOf:
  """A union member: a tuple (or list) of `item`s, from an annotation
  `tuple[item, ...]` or `list[item]`; the command line writes it as a comma
  list (`=8,16`), and the config holds it as a tuple."""

  item: type


def _is(value, kind):
  """isinstance(value, kind) for a simple type or a _TupleOf (a bool is an
  int only where bool itself is asked for)."""
  if isinstance(kind, _TupleOf):
    return isinstance(value, (tuple, list)) and all(
      _is(x, kind.item) for x in value
    )
  if isinstance(value, bool) and kind is not bool:
    return False
  return isinstance(value, kind)


class _UnionMeta(type):
  """isinstance(v, U) for a union U: v is one of U.members (a bool only
  when bool is one: bool is an int subclass; a tuple or list of items for
  a _TupleOf member)."""

  def __instancecheck__(cls, value):
    return any(_is(value, t) for t in cls.members)


def _parse_simple(text, members, raw=None):
  """`text` (stripped) as the first of the simple `members` it reads as
  (a str: `raw`, the text as given, when given), or raises ValueError."""
  if _NONE in members and text in ('None', 'none'):
    return None
  if bool in members and text.lower() in ('true', 'false'):
    return text.lower() == 'true'
  if int in members and re.fullmatch(r'[+-]?\d+', text):
    return int(text)
  if float in members:
    try:
      return float(text)
    except ValueError:
      pass
  if str in members:
    return text if raw is None else raw
  raise ValueError(text)


class _UnionParser(flags.ArgumentParser):
  """A command-line string as the first of the union's types it reads as:
  a comma list ('8,16', also '(8, 16)' or '[8,16]'; '8,' is one item) as a
  tuple of the item type where the union has a _TupleOf member, else None
  ('None'), bool ('True'/'False'), int, float, else str."""

  def __init__(self, union):
    super().__init__()
    self.union = union

  def parse(self, argument):
    members = self.union.members
    if not isinstance(argument, str):
      if argument is None or isinstance(argument, self.union):
        return tuple(argument) if isinstance(argument, list) else argument
      raise TypeError(f'{argument!r} is not {self.flag_type()}')
    text = argument.strip()
    sequences = [t for t in members if isinstance(t, _TupleOf)]
    listed = ',' in text or text[:1] + text[-1:] in ('()', '[]')
    if sequences and listed:
      inner = text[1:-1] if text[:1] + text[-1:] in ('()', '[]') else text
      parts = [p.strip() for p in inner.split(',')]
      if parts and not parts[-1]:
        parts.pop()  # '8,': one item
      for seq in sequences:
        try:
          return tuple(_parse_simple(p, (seq.item,)) for p in parts)
        except ValueError:
          pass
    try:
      return _parse_simple(
        text,
        [t for t in members if not isinstance(t, _TupleOf)],
        raw=argument,
      )
    except ValueError:
      pass
    if sequences and not listed:  # one item of a tuple-only option
      for seq in sequences:
        try:
          return (_parse_simple(text, (seq.item,)),)
        except ValueError:
          pass
    raise ValueError(f'{argument!r} is not {self.flag_type()}')

  def flag_type(self):
    return ' or '.join(_type_name(t) for t in self.union.members)


def _type_name(t):
  if isinstance(t, _TupleOf):
    return f'a comma list of {_type_name(t.item)}'
  return 'None' if t is _NONE else t.__name__


def _union_type(members):
  """The field type of a ConfigDict value that may be any of `members`
  (module-level, so a config holding it can be copied and pickled)."""
  sequences = tuple(t for t in members if isinstance(t, _TupleOf))
  members = (*(t for t in _SIMPLE if t in members), *dict.fromkeys(sequences))
  if members not in _UNION_TYPES:
    name = 'Or'.join(
      f'{_type_name(t.item).capitalize()}Tuple'
      if isinstance(t, _TupleOf)
      else _type_name(t).capitalize()
      for t in members
    )
    union = _UnionMeta(name, (), {'members': members, '__module__': __name__})
    globals()[name] = union
    config_flags.register_flag_parser_for_type(union, _UnionParser(union))
    _UNION_TYPES[members] = union
  return _UNION_TYPES[members]


def _annotation_types(annotation):
  """The types an annotation admits (a _TupleOf for `tuple[T, ...]` or
  `list[T]` of a simple T), or None when it says nothing simple."""
  if annotation is inspect.Parameter.empty:
    return None
  if annotation is None:
    return (_NONE,)
  origin = typing.get_origin(annotation)
  if origin in (typing.Union, types.UnionType):
    parts = [_annotation_types(a) for a in typing.get_args(annotation)]
    if any(p is None for p in parts):
      return None
    return tuple(t for p in parts for t in p)
  if origin is typing.Literal:
    return tuple(dict.fromkeys(type(v) for v in typing.get_args(annotation)))
  if origin in (tuple, list):
    args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
    if len(set(args)) == 1 and args[0] in _SIMPLE[1:]:
      return (_TupleOf(args[0]),)
    return None
  if origin is None and isinstance(annotation, type):
    return (annotation,)
  return None  # dict[...], strings, ...: the default's type decides


def field_type(parameter):
  """The ConfigDict field type of a core option (an inspect.Parameter):
  from its annotation, else its default's type; a union of simple types
  (or a None default), or an option that takes a sequence, gets a union
  type the command line can set to any of them; a None default with no
  annotation takes any literal (object)."""
  default = parameter.default
  kinds = _annotation_types(parameter.annotation)
  if kinds is None:
    if default is None:
      return object
    kinds = (type(default),)
  if default is None and _NONE not in kinds:
    kinds = (*kinds, _NONE)
  sequences = any(isinstance(t, _TupleOf) for t in kinds)
  if len(kinds) == 1 and not sequences:
    return kinds[0]
  if all(t in _SIMPLE or isinstance(t, _TupleOf) for t in kinds):
    return _union_type(kinds)
  return object


def _field(value, kind):
  if value is not None and type(value) is kind:
    return value
  if isinstance(kind, _UnionMeta) and any(
    isinstance(t, _TupleOf) for t in kind.members
  ):
    if isinstance(value, list):
      value = tuple(value)  # config.json holds a list
    elif isinstance(value, str) and str not in kind.members:
      try:  # a config saved when the option was a comma-list string
        value = _UnionParser(kind).parse(value)
      except ValueError:
        pass
  return ml_collections.FieldReference(value, field_type=kind)


def attention_block(values):
  """The `model.attention` ConfigDict of `values` (a dict with 'name'):
  every option of the core, `values` over the defaults (a config saved
  before an option existed gets its default), each typed by field_type."""
  values = dict(values)
  name = values['name']
  params = registry.option_parameters(name)
  registry.check_options(values)
  block = ml_collections.ConfigDict()
  block.name = name
  for key, p in params.items():
    value = values.get(key, p.default)
    try:
      block[key] = _field(value, field_type(p))
    except TypeError:
      raise UserError(
        f'model.attention.{key}={value!r} is not a valid {name} option value '
        f'(its default is {registry.shown(p.default)}); fix it.'
      ) from None
  return block


def apply_model(c, model_name, overrides=None, recipe=None):
  """Sets c.model_name and c.model.attention for `model_name` (every core
  option, then the MODELS entry), then its MODEL_SETTINGS, then `recipe`
  (its own paper's settings for this task, {flattened key: value}:
  configs/models.py PAPER_RECIPES), then the task's tuned `overrides`
  ({model: {flattened key: value}}, the task file's MODEL_OVERRIDES).
  Raises ValueError for an unknown model."""
  block = attention_defaults(model_name)
  c.model_name = model_name
  c.model.attention = attention_block(block)
  for key, value in MODEL_SETTINGS.get(model_name, {}).items():
    _set_flat(c, key, value)
  # A model with its own paper's LRA recipe (s5) takes it on every task;
  # the presets (small, smoke) then resize it.
  for key, value in (recipe or {}).items():
    _set_flat(c, key, value)
  for key, value in (overrides or {}).get(model_name, {}).items():
    _set_flat(c, key, value)


def _set_flat(c, dotted, value):
  *parents, leaf = dotted.split('.')
  node = c
  for p in parents:
    node = node[p]
  if leaf not in node:
    if parents == ['model', 'attention']:
      raise ValueError(registry.unknown_option_sentence(node.name, leaf))
    raise ValueError(f'Unknown config key {dotted!r} in a model override.')
  node[leaf] = value


def check_attention(config):
  """The `model.attention` block names a registered core and only options
  it takes (a --config.model.attention.name flag keeps the options of the
  model's own core: the model name is how to choose another one), and its
  per-layer lists have model.num_layers items (registry.check_per_layer).
  Part of lra.train.config.check, beside lra.train.validate.check_config."""
  block = config.model.attention.to_dict()
  name = block.get('name')
  registry.get_core_class(name)  # an unknown core: its own sentence
  known = registry.options_of(name)
  unknown = [k for k in block if k != 'name' and k not in known]
  if not unknown:
    # A per-layer list (longformer's window) has one value per layer.
    registry.check_per_layer(block, config.model.num_layers)
    return
  try:
    core = core_of(config.model_name)
  except (ValueError, UserError):
    core = name
  if core != name:
    raise UserError(
      f'--config.model.attention.name={name} keeps the options of the '
      f"{config.model_name} model's core {core} ({', '.join(unknown)}), "
      f'which {name} does not take; {_model_instead(config.task, name)}.'
    )
  raise UserError(registry.unknown_option_sentence(name, unknown[0]))


def _model_instead(task, core):
  """'choose the core with the model name instead (configs/<task>.py:
  <core>)', or, for a core that is no model name, what it is."""
  if core in NOT_MODELS:
    return f'{core} is {NOT_MODELS[core]}'
  return (
    f'choose the core with the model name instead (configs/{task}.py:{core})'
  )


def option_sentence(model, key, suggestion=None, name=None, core=None):
  """The one sentence for an unknown --config.model.attention.<key> of
  `model` (or of `core`): the core's options and their defaults; a
  --config.model.attention.name=<name> flag keeps the options of the
  model's own core, so that case says to choose the model instead. None
  when the model is unknown (its own sentence comes elsewhere); the flag
  parser's explanation (lra/train/cli.py)."""
  if core is None:
    try:
      core = core_of(model)
    except (ValueError, UserError):
      return None
  if name and name != core:
    return (
      f'--config.model.attention.name={name} keeps the options of the '
      f"{model} model's core {core}, so {key!r} is not one of them; "
      f'{_model_instead("<task>", name)}.'
    )
  return registry.unknown_option_sentence(core, key, suggestion)
