"""The trained tiny model pair, once per session (skips where transformers is missing).

Weights come from dyadic.integrations.tiny_models' cache ($DYADIC_CACHE_DIR, else
the user cache directory); the first run trains them (TEST_RECIPE, well under a
minute on 2 CPU cores) and later runs load them.
"""

import time

import pytest


@pytest.fixture(scope="session")
def tiny_pair():
    """(target, draft) of TEST_RECIPE; torch runs on one thread meanwhile (models this
    small are fastest there, and a 2-core machine shared with other work stalls torch's
    thread pool), restored at the end of the session."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from dyadic.integrations import tiny_models

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    start = time.perf_counter()
    target, draft = tiny_models.load_pair(tiny_models.TEST_RECIPE)
    print(f"\ntiny model pair ready in {time.perf_counter() - start:.1f} s")
    yield target, draft
    torch.set_num_threads(threads)
