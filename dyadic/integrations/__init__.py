"""Integrations of dyadic's sampling primitives with inference engines.

Each submodule imports its engine lazily: ``import dyadic.integrations`` and
``import dyadic.integrations.transformers`` import neither torch nor
transformers; the functions that need them raise ImportError naming the extra
to install (``pip install 'dyadic[transformers]'``).  See docs/integrations.md.
"""
