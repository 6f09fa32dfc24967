"""Pallas kernels: fused random-feature attention; see docs/pallas.md.

Only the kernel module is imported here (it depends on jax alone), so ``kernelformer.attention`` can
import this package without a cycle. The XLA reference used by the tests is
``kernelformer.pallas.reference`` (import it explicitly).
"""
from kernelformer.pallas.feature_attention import FEATURES, feature_attention, supported

__all__ = ['FEATURES', 'feature_attention', 'supported']
