"""How much of Mamba's mixer time is its scan: fwd+bwd with the scan (each
kernel asked for), and with the scan replaced by a stand-in that touches
the same inputs once.

  python -m experiments.mamba_recall.scan_share [--rounds 7] [--kernels xla,native]

Per shape (MQAR small; 1K, 2K, 4K as in docs/benchmark.md), the programs
(one per scan kernel, `--kernels`: the mixer's scan_kernel values, default
auto, and the stand-in) are compiled, then timed in alternating rounds
(jit(grad) of the output's sum with respect to the parameters and the
input, float32); prints the medians, each kernel's against the first, and
each one's share, 1 - without / with. The stand-in,
u dt sum(B C) + sum(A), keeps every input in the gradient so that nothing
upstream of the scan is pruned. A share s bounds what a faster scan can
give the mixer: 1 / (1 - s) at most.
"""

import argparse
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.attention import Mask
import models.mixers.mamba as mamba_module

# (batch, length, width, causal)
SHAPES = (
  (64, 64, 64, True),
  (2, 1024, 128, False),
  (2, 2048, 64, False),
  (1, 4096, 128, False),
  (1, 4096, 64, True),
)


def stand_in(u, dt, a, b, c, chunk):
  del chunk
  return u * dt * jnp.sum(b * c, -1, keepdims=True) + jnp.sum(a)


def programs(batch, length, width, causal, kernels=('auto',)):
  """{'<kernel>': f for each scan kernel, 'without': f} and their
  arguments: the mixer (scan_kernel = each of `kernels`) fwd+bwd."""
  x = np.random.default_rng(0).standard_normal((batch, length, width))
  x = jnp.asarray(x, jnp.float32)
  mask = Mask(jnp.ones((batch, length), bool), causal)
  state, out, real = None, {}, mamba_module.scan_for
  try:
    for name in (*kernels, 'without'):
      mixer = mamba_module.Mamba(
        emb_dim=width, num_heads=2, max_length=length, dropout_rate=0.0,
        dtype=jnp.float32, rngs=nnx.Rngs(0),
        scan_kernel=kernels[0] if name == 'without' else name,
      )  # fmt: skip
      graph, state = nnx.split(mixer)  # the same parameters every time

      def loss(state, x, graph=graph):
        return jnp.sum(nnx.merge(graph, state)(x, mask)[0])

      if name == 'without':
        mamba_module.scan_for = lambda kernel: stand_in  # read when traced
      f = jax.jit(jax.grad(loss, argnums=(0, 1)))
      jax.block_until_ready(f(state, x))
      out[name] = f
  finally:
    mamba_module.scan_for = real
  return out, (state, x)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=7)
  parser.add_argument(
    '--kernels',
    default='auto',
    help="the mixer's scan_kernel values to time, commas (auto: the C++ "
    'scan on a CPU): e.g. xla,native',
  )
  args = parser.parse_args(argv)
  kernels = tuple(k for k in args.kernels.split(',') if k)
  bad = [k for k in kernels if k not in mamba_module.SCAN_KERNELS]
  if bad or not kernels:
    parser.error(
      f'--kernels takes {", ".join(mamba_module.SCAN_KERNELS)}, got '
      f'{args.kernels!r}'
    )
  for batch, length, width, causal in SHAPES:
    fs, inputs = programs(batch, length, width, causal, kernels)
    times = {k: [] for k in fs}
    for _ in range(max(1, args.rounds)):
      for name, f in fs.items():
        start = time.perf_counter()
        jax.block_until_ready(f(*inputs))
        times[name].append(time.perf_counter() - start)
    ms = {k: 1000 * float(np.median(v)) for k, v in times.items()}
    form = 'causal' if causal else 'bidirectional'
    parts = []
    for k in kernels:
      vs = '' if k == kernels[0] else f' ({ms[kernels[0]] / ms[k]:.2f}x)'
      share = 1 - ms['without'] / ms[k]
      parts.append(f'{k} {ms[k]:.0f} ms{vs}, scan share {share:.2f}')
    print(
      f'B {batch}, L {length}, E {width}, {form}: {"; ".join(parts)}; '
      f'without the scan {ms["without"]:.0f} ms',
      flush=True,
    )


if __name__ == '__main__':
  main()
