"""Pallas kernels: fused random-feature attention; see docs/pallas.md.

The package depends on jax alone, so ``kernelformer.attention`` imports it from below. The XLA path the
kernels must match (the tests' and ``scripts/gpu_check.py``'s oracle) is built from the attention
library and so lives above it: ``kernelformer.bench.pallas_reference``.
"""
from kernelformer.pallas.feature_attention import FEATURES, feature_attention, supported

__all__ = ['FEATURES', 'feature_attention', 'supported']
