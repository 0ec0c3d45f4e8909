"""Integrations of dyadic's sampling primitives with inference engines.

Each submodule imports its engine lazily: ``import dyadic.integrations``,
``dyadic.integrations.transformers`` and ``dyadic.integrations.vllm`` import
neither torch, transformers nor vLLM; the functions that need them raise
ImportError naming the extra to install (``pip install 'dyadic[transformers]'``).
See docs/integrations.md.
"""
