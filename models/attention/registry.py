"""Attention registry: name -> core class. The one place names are resolved."""

import importlib
import inspect

from errors import UserError

_CORES = {}


def register(name):
  def wrap(cls):
    if name in _CORES:
      raise ValueError(f'attention core {name!r} registered twice')
    _CORES[name] = cls
    cls.registry_name = name
    return cls

  return wrap


# The modules of this package that define cores; importing one registers it.
CORE_MODULES = (
  'softmax',
  'local',
  'sparse_transformer',
  'longformer',
  'bigbird',
  'sinkhorn',
  'synthesizer',
  'linformer',
  'linear_transformer',
  'performer',
  'reformer',
  'transformer_xl',
  'compressive_transformer',
  'none',
)


def _load_all():
  for name in CORE_MODULES:
    importlib.import_module(f'models.attention.{name}')


def known_cores():
  _load_all()
  return tuple(_CORES)


def get_core_class(name):
  _load_all()
  if name not in _CORES:
    raise UserError(
      f'Unknown attention core {name!r}; known cores: {", ".join(_CORES)}.'
    )
  return _CORES[name]


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
  """Builds the core named by options['name'] with the rest as arguments.

  layer_index: the block's index in the encoder, for cores whose random
  layout is a function of (seed, layer, head) (BigBird, Reformer).
  """
  options = dict(options)
  cls = get_core_class(options.pop('name'))
  accepted = inspect.signature(cls.__init__).parameters
  unknown = [k for k in options if k not in accepted]
  if unknown:
    raise UserError(
      f'Attention core {cls.registry_name!r} has no option {unknown[0]!r}; '
      f'its options: {", ".join(_own_options(cls))}.'
    )
  return cls(
    num_heads=num_heads,
    head_dim=head_dim,
    max_length=max_length,
    dropout_rate=dropout_rate,
    dtype=dtype,
    rngs=rngs,
    layer_index=layer_index,
    **options,
  )


_COMMON = (
  'self',
  'num_heads',
  'head_dim',
  'max_length',
  'dropout_rate',
  'dtype',
  'rngs',
  'layer_index',
)


def _own_options(cls):
  params = inspect.signature(cls.__init__).parameters
  return [p for p in params if p not in _COMMON and p != 'kwargs'] or ['none']
