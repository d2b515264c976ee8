"""Attention cores, one file per mechanism, all behind one registry.

Shape legend for tensor names (`q_BxLxHxD`): B batch, L query length, M key
length, H heads, D head dim, E width, F random features, K Linformer length,
N buckets, C chunk/block, W window, S segments.

Importing this package registers every core (registry.py imports them).
"""

from models.attention.base import AttentionCore, Mask
from models.attention.registry import build, known_cores, register

__all__ = ['AttentionCore', 'Mask', 'build', 'known_cores', 'register']
