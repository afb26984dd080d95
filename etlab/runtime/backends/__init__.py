"""Backends built into the etlab runtime; importing this package registers each of them."""

from etlab.runtime.backends import demo_backend

__all__ = ["demo_backend"]
