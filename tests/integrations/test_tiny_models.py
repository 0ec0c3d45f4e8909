"""dyadic.integrations.tiny_models: the cache key covers the recipe, training is
deterministic, a cached pair is loaded instead of retrained, and the
integrations import neither torch nor transformers until used."""

import dataclasses
import os
import subprocess
import sys

import pytest

from dyadic.integrations import tiny_models

MICRO = tiny_models.Recipe(target=tiny_models.ModelShape(n_layer=1, n_embd=16, n_head=2,
                                                         n_positions=64),
                           draft=tiny_models.ModelShape(n_layer=1, n_embd=8, n_head=1,
                                                        n_positions=64),
                           steps=3, batch_size=2, seq_len=16, corpus=("bisect.py",))


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_recipe_key_covers_every_field():
    pytest.importorskip("transformers")
    base = tiny_models.recipe_key(MICRO)
    changed = [dataclasses.replace(MICRO, steps=4), dataclasses.replace(MICRO, seed=1),
               dataclasses.replace(MICRO, lr=1e-3),
               dataclasses.replace(MICRO, corpus=("heapq.py",)),
               dataclasses.replace(MICRO, target=dataclasses.replace(MICRO.target, n_embd=32))]
    keys = {tiny_models.recipe_key(r) for r in changed}
    assert base not in keys and len(keys) == len(changed)
    assert tiny_models.recipe_key(MICRO, b"other corpus") != base


def test_load_pair_trains_once_then_loads_the_same_weights(tmp_path):
    torch = pytest.importorskip("torch")
    target, draft = tiny_models.load_pair(MICRO, cache_dir=tmp_path)
    entry = tmp_path / "tiny-models" / tiny_models.recipe_key(MICRO)
    assert sorted(os.listdir(entry)) == ["draft", "target"]
    assert sorted(os.listdir(tmp_path / "tiny-models")) == [entry.name]  # no partial entries
    stamp = os.stat(entry / "target").st_mtime_ns
    target2, draft2 = tiny_models.load_pair(MICRO, cache_dir=tmp_path)
    assert os.stat(entry / "target").st_mtime_ns == stamp
    for a, b in ((target, target2), (draft, draft2)):
        sa, sb = state(a), state(b)
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not target2.training and target2.config.vocab_size == 256
    # the target and the draft have the recipe's shapes
    assert target2.config.n_embd == 16 and draft2.config.n_embd == 8


def test_training_is_deterministic():
    torch = pytest.importorskip("torch")
    corpus = tiny_models.corpus_bytes(MICRO)
    a = state(tiny_models.train(MICRO.target, MICRO, corpus))
    b = state(tiny_models.train(MICRO.target, MICRO, corpus))
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = state(tiny_models.train(MICRO.target, dataclasses.replace(MICRO, seed=1), corpus))
    assert not all(torch.equal(a[k], other[k]) for k in a)


def test_encode_decode_bytes():
    assert tiny_models.encode("é\n") == [0xC3, 0xA9, 10]
    assert tiny_models.decode([0xC3, 0xA9, 10]) == "é\n"


def test_integrations_import_neither_torch_nor_transformers():
    code = ("import sys, dyadic.integrations.transformers, dyadic.integrations.tiny_models; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_transformers_names_the_extra():
    code = ("import sys; sys.modules['torch'] = sys.modules['transformers'] = None\n"
            "from dyadic.integrations import transformers as dyt\n"
            "try:\n"
            "    dyt.sample(None, [[1]], max_new_tokens=1, seed=0)\n"
            "except ImportError as exc:\n"
            "    assert \"pip install 'dyadic[transformers]'\" in str(exc), exc\n"
            "else:\n"
            "    raise SystemExit('no ImportError')\n")
    subprocess.run([sys.executable, "-c", code], check=True)
