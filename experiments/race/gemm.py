r"""The matrix products under the race's pairs, XLA's CPU backend against
PyTorch's, one product at a time.

  python -m experiments.race.gemm --rounds 30

Each product runs jitted in JAX and as torch.matmul on the same float32
arrays, alternating in this one process; prints each side's median ms, the
median of the per-round ratios torch ms / JAX ms (> 1: JAX faster) and the
GFLOP/s of each. The shapes are those of the race at B = 2, H = 4, D = 64,
L = 4096: the projections of a layer (x W), Linformer's length projection
(E^T K over all heads at once), its scores against k = 256 slots, and the
exact core's scores. A pair made of these products is as fast as the
slower library's products allow, whatever either side's code around them.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from lra.errors import UserError

# name: (shape of a, shape of b) for a @ b
SHAPES = {
  'x W: [8192, 256] @ [256, 256]': ((8192, 256), (256, 256)),
  'E^T K: [256, 4096] @ [4096, 512]': ((256, 4096), (4096, 512)),
  'scores vs 256 slots: [8, 4096, 64] @ [8, 64, 256]': (
    (8, 4096, 64),
    (8, 64, 256),
  ),
  'exact scores: [8, 4096, 64] @ [8, 64, 4096]': (
    (8, 4096, 64),
    (8, 64, 4096),
  ),
}


def _ms(fn):
  start = time.perf_counter()
  fn()
  return (time.perf_counter() - start) * 1e3


def measure(rounds, seed=0):
  """One row per product: medians, the ratio and GFLOP/s."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UserError('the GEMM check needs PyTorch: pip install torch') from None
  rng = np.random.default_rng(seed)
  rows = []
  for name, (sa, sb) in SHAPES.items():
    a = rng.standard_normal(sa, np.float32)
    b = rng.standard_normal(sb, np.float32)
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    matmul = jax.jit(jnp.matmul)
    ours = lambda: jax.block_until_ready(matmul(ja, jb))  # noqa: E731
    peer = lambda: torch.matmul(ta, tb)  # noqa: E731
    np.testing.assert_allclose(
      np.asarray(ours()), peer().numpy(), rtol=1e-3, atol=1e-2
    )
    jax_ms, torch_ms = [], []
    for _ in range(rounds):
      jax_ms.append(_ms(ours))
      torch_ms.append(_ms(peer))
    flop = 2 * np.prod(sa) * sb[-1]
    rows.append(
      {
        'product': name,
        'jax_ms': statistics.median(jax_ms),
        'torch_ms': statistics.median(torch_ms),
        'torch_over_jax': statistics.median(
          t / j for t, j in zip(torch_ms, jax_ms)
        ),
        'jax_gflops': flop / statistics.median(jax_ms) / 1e6,
        'torch_gflops': flop / statistics.median(torch_ms) / 1e6,
      }
    )
  return rows


def markdown(rows):
  out = [
    '| product | JAX ms | torch ms | torch / JAX | JAX GFLOP/s '
    '| torch GFLOP/s |',
    '|---|---|---|---|---|---|',
  ]
  for r in rows:
    out.append(
      f'| {r["product"]} | {r["jax_ms"]:.2f} | {r["torch_ms"]:.2f} | '
      f'{r["torch_over_jax"]:.2f} | {r["jax_gflops"]:.0f} | '
      f'{r["torch_gflops"]:.0f} |'
    )
  return '\n'.join(out) + '\n'


def main(argv=None):
  p = argparse.ArgumentParser(
    prog='python -m experiments.race.gemm',
    description="The race's matrix products: XLA's CPU backend against torch.",
  )
  p.add_argument('--rounds', type=int, default=30)
  args = p.parse_args(argv)
  if args.rounds < 1:
    p.error('--rounds must be at least 1')
  print(markdown(measure(args.rounds)), end='')


if __name__ == '__main__':
  try:
    main()
  except UserError as e:
    raise SystemExit(f'error: {e}') from None
