"""The integration with the models on a CUDA device: backends "cuda" and "numba"
(logits kept on the device) give the tokens of backend "cpu" (the same logits
copied to the host).  Skipped without a GPU."""

import copy

import pytest

from dyadic import _backend
from dyadic.integrations import tiny_models
from dyadic.integrations import transformers as dyt

pytestmark = pytest.mark.gpu

PROMPTS = [tiny_models.encode(t) for t in ("    def ", "import os\n", "x")]


@pytest.fixture(scope="module")
def cuda_pair(request):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return tuple(copy.deepcopy(m).to("cuda") for m in request.getfixturevalue("tiny_pair"))


def need(backend):
    try:
        be = _backend.get(backend)
    except Exception as exc:  # noqa: BLE001 - the reason becomes the skip message
        pytest.skip(f"backend {backend!r} unavailable: {exc}")
    if not be.usable():
        pytest.skip(f"backend {backend!r} has no device here")


@pytest.mark.parametrize("backend", ["cuda", "numba"])
@pytest.mark.parametrize("temperature,top_k", [(0.9, None), (1.0, 20), (0.0, None)])
def test_generate_on_gpu_backends_matches_cpu(cuda_pair, backend, temperature, top_k):
    need(backend)
    target, draft = cuda_pair
    kw = dict(max_new_tokens=16, num_drafts=3, seed=[1, 2, 3], temperature=temperature,
              top_k=top_k, draft_temperature=1.2, draft_top_k=32)
    gpu = dyt.generate(target, draft, PROMPTS, backend=backend, **kw)
    cpu = dyt.generate(target, draft, PROMPTS, backend="cpu", **kw)
    assert gpu.new_tokens == cpu.new_tokens
    assert (gpu.stats.accepted == cpu.stats.accepted).all()


@pytest.mark.parametrize("backend", ["cuda", "numba"])
def test_sample_on_gpu_backends_matches_cpu(cuda_pair, backend):
    need(backend)
    target, _ = cuda_pair
    kw = dict(max_new_tokens=16, seed=[4, 5, 6], temperature=1.0, top_p=0.9)
    assert (dyt.sample(target, PROMPTS, backend=backend, **kw).new_tokens
            == dyt.sample(target, PROMPTS, backend="cpu", **kw).new_tokens)
