"""Method plugins: one module per method, each registering itself with ``register_method``."""
