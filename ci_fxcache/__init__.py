"""fxcache: keep torch.compile caches alive in CI, and prove hot loads are safe."""

__version__ = "1.0.0"
