"""Memory of an attention core, read from XLA's compiled memory analysis.

No device memory is touched: the forward + backward pass is lowered with
abstract inputs and compiled, and XLA's buffer assignment says how many bytes
it needs. That works on CPU, so tests can check that an efficient core really
is sub-quadratic:

  small = core_memory_bytes({'name': 'local'}, 1024)
  large = core_memory_bytes({'name': 'local'}, 2048)
  assert large / small < 2.5   # the exact softmax core gives about 4
"""

from flax import nnx
import jax
import jax.numpy as jnp

from models.attention.base import Mask
from models.attention.registry import build, get_core_class


def compiled_memory(compiled):
  """Bytes of a compiled XLA program, from `compiled.memory_analysis()`.

  Args:
    compiled: a `jax.stages.Compiled` (`jax.jit(f).lower(...).compile()`).

  Returns:
    A dict of ints: 'temp' (intermediate buffers), 'argument', 'output',
    'alias' (outputs sharing a donated argument's buffer), 'generated_code'
    and 'peak' = temp + argument + output - alias, the bytes live at once at
    most. Values are per device for a sharded program.
  """
  m = compiled.memory_analysis()
  get = lambda name: int(getattr(m, name, 0) or 0)  # noqa: E731
  out = {
    'temp': get('temp_size_in_bytes'),
    'argument': get('argument_size_in_bytes'),
    'output': get('output_size_in_bytes'),
    'alias': get('alias_size_in_bytes'),
    'generated_code': get('generated_code_size_in_bytes'),
  }
  out['peak'] = out['temp'] + out['argument'] + out['output'] - out['alias']
  return out


def core_memory(
  attention_options,
  length,
  *,
  batch=1,
  num_heads=2,
  head_dim=16,
  causal=False,
  padding=True,
  dtype=jnp.float32,
):
  """compiled_memory() of jit(grad of sum(core(q, k, v)) w.r.t. q, k, v).

  Args:
    attention_options: a `model.attention` block, {'name': ..., options}.
    length: query and key length L.
    batch, num_heads, head_dim: the shapes of q, k, v ([B, L, H, D]).
    causal: the mask's causal flag.
    padding: give the core a key padding mask (bool [B, L], an input).
    dtype: dtype of q, k, v and of the core's computation.

  Returns:
    The dict of `compiled_memory` for the forward + backward program.
  """
  cls = get_core_class(attention_options['name'])
  if causal and not cls.supports_causal:
    raise ValueError(f'{cls.registry_name!r} does not support causal masks')
  core = build(
    attention_options,
    num_heads=num_heads,
    head_dim=head_dim,
    max_length=length,
    dropout_rate=0.0,
    dtype=dtype,
    rngs=nnx.Rngs(0),
  )
  graphdef, state = nnx.split(core)

  def loss(q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, state, padding_BxL):
    module = nnx.merge(graphdef, state)
    if cls.shared_qk:
      k_BxLxHxD = q_BxLxHxD
    out_BxLxHxD, _ = module(
      q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, Mask(padding_BxL, causal)
    )
    return jnp.sum(out_BxLxHxD.astype(jnp.float32))

  qkv = jax.ShapeDtypeStruct((batch, length, num_heads, head_dim), dtype)
  pad = jax.ShapeDtypeStruct((batch, length), bool) if padding else None
  step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  return compiled_memory(step.lower(qkv, qkv, qkv, state, pad).compile())


def core_memory_bytes(attention_options, length, **kwargs):
  """Temporary bytes of the core's forward + backward at `length`.

  The 'temp' entry of `core_memory` (same arguments): intermediate buffers
  only, without q, k, v and their gradients, so that its growth with length
  is the core's own (about 4x per doubling for exact softmax attention).
  """
  return core_memory(attention_options, length, **kwargs)['temp']
