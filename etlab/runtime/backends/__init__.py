"""Backends built into the etlab runtime; importing this package registers each of them."""

from etlab.runtime.backends import demo_backend, xnnpack

__all__ = ["demo_backend", "xnnpack"]
