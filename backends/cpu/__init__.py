"""The CPU backend: Cython loops over the shared integer core (backends/include)."""
