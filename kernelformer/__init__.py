"""kernelformer: kernelized (linear-complexity) attention for the Long Range Arena, in JAX/Flax."""
from kernelformer import registry
from kernelformer.registry import build as build_attention
from kernelformer.registry import list_kernels

__all__ = ['registry', 'build_attention', 'list_kernels']
