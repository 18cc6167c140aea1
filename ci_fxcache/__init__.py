"""fxcache: keep torch.compile caches alive in CI, and prove hot loads are safe."""

__version__ = "0.1.0"
