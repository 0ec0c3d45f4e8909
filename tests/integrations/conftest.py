"""The trained tiny model pair, once per session (skips where transformers is missing).

Weights come from dyadic.integrations.tiny_models' cache ($DYADIC_CACHE_DIR, else
the user cache directory); the first run trains them (TEST_RECIPE, well under a
minute on 2 CPU cores) and later runs load them.
"""

import time

import pytest


@pytest.fixture(scope="session")
def tiny_pair():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from dyadic.integrations import tiny_models

    start = time.perf_counter()
    target, draft = tiny_models.load_pair(tiny_models.TEST_RECIPE)
    print(f"\ntiny model pair ready in {time.perf_counter() - start:.1f} s")
    return target, draft
