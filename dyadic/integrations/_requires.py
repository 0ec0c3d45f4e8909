"""The optional dependencies of the integrations, imported on first use."""

import importlib


def transformers_stack():
    """(torch, transformers), or ImportError naming the extra that installs them."""
    mods = []
    for name in ("torch", "transformers"):
        try:
            mods.append(importlib.import_module(name))
        except ImportError as exc:
            raise ImportError(
                f"dyadic.integrations needs {name!r} ({exc}); install the extra: "
                f"pip install 'dyadic[transformers]'") from exc
    return tuple(mods)
