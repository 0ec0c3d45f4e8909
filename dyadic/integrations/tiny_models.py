"""Small byte-level causal LMs trained in-process on Python's standard library.

Real transformers models for tests and examples without any download: a
target and a smaller draft GPT-2 (``transformers.GPT2LMHeadModel``) over the
256 byte values, trained for a bounded number of steps on a fixed selection of
the standard library's ``.py`` sources (text that ships with every Python).
The trained weights are cached on disk under a key that hashes the whole
recipe (configs, steps, seed, corpus bytes, torch and transformers versions),
so a second call loads them instead of training.

Cache directory: the ``cache_dir`` argument, else ``$DYADIC_CACHE_DIR``, else
``$XDG_CACHE_HOME/dyadic``, else ``~/.cache/dyadic``; entries live in
``tiny-models/<key>/{target,draft}`` (``save_pretrained`` format).

Training runs on the CPU with ``torch.manual_seed(recipe.seed)`` and
``torch.set_num_threads(recipe.threads)`` (restored afterwards; one thread by
default: models this small gain nothing from more, and lose a lot on a busy
machine): the same machine and library versions give the same weights.  Nothing in dyadic's
guarantees depends on the weights: any trained (or untrained) model gives
exact, reproducible sampling; these recipes only make the models' text and
acceptance rates meaningful.
"""

import dataclasses
import hashlib
import json
import os
import shutil
import sysconfig
import tempfile
import time
from dataclasses import dataclass

from ._requires import transformers_stack

VOCAB = 256  # token id = byte value

# Standard-library modules present in every CPython >= 3.10 (the corpus is their bytes).
CORPUS_FILES = ("textwrap.py", "string.py", "functools.py", "heapq.py", "bisect.py",
                "fractions.py", "queue.py", "shlex.py", "contextlib.py", "dataclasses.py")


@dataclass(frozen=True)
class ModelShape:
    """A GPT-2 shape: layers, width, heads and the context length."""

    n_layer: int
    n_embd: int
    n_head: int
    n_positions: int = 512


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the trained weights (all of it enters the cache key).

    ``steps`` AdamW steps of ``batch_size`` random windows of ``seq_len + 1``
    bytes from the corpus, learning rate ``lr`` with linear decay to 10 %.
    """

    target: ModelShape
    draft: ModelShape
    steps: int
    batch_size: int = 16
    seq_len: int = 96
    lr: float = 3e-3
    seed: int = 0
    threads: int = 1
    corpus: tuple = CORPUS_FILES


# The test suite's pair: trains in about half a minute on one CPU core.
TEST_RECIPE = Recipe(target=ModelShape(n_layer=2, n_embd=64, n_head=4),
                     draft=ModelShape(n_layer=1, n_embd=32, n_head=2), steps=400)

# The example's pair: a deeper, wider target, so that speculation has something to save.
EXAMPLE_RECIPE = Recipe(target=ModelShape(n_layer=3, n_embd=96, n_head=4),
                        draft=ModelShape(n_layer=1, n_embd=48, n_head=2), steps=400)


def corpus_bytes(recipe):
    """The training text: the recipe's standard-library sources, concatenated (bytes)."""
    root = sysconfig.get_paths()["stdlib"]
    parts = []
    for name in recipe.corpus:
        with open(os.path.join(root, name), "rb") as f:
            parts.append(f.read())
    return b"\n".join(parts)


def recipe_key(recipe, corpus=None):
    """Hex sha256 of the recipe, the corpus bytes and the torch / transformers versions."""
    torch, transformers = transformers_stack()
    corpus = corpus_bytes(recipe) if corpus is None else corpus
    doc = {"format": 2, "recipe": dataclasses.asdict(recipe),
           "corpus_sha256": hashlib.sha256(corpus).hexdigest(),
           "torch": torch.__version__, "transformers": transformers.__version__}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def cache_root(cache_dir=None):
    """The directory the trained weights are cached under (see the module docstring)."""
    if cache_dir is not None:
        return os.fspath(cache_dir)
    if os.environ.get("DYADIC_CACHE_DIR"):
        return os.environ["DYADIC_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dyadic")


def build(shape):
    """An untrained ``GPT2LMHeadModel`` of ``shape`` over the 256 bytes (no dropout)."""
    _, transformers = transformers_stack()
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=shape.n_positions, n_embd=shape.n_embd,
        n_layer=shape.n_layer, n_head=shape.n_head, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # the loss train() uses (transformers' causal-LM loss)
    return model


def _progress(total, desc, enabled):
    """A tqdm bar where tqdm is installed and ``enabled``; otherwise plain prints."""
    if not enabled:
        return _Quiet()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Prints(total, desc)
    return tqdm(total=total, desc=desc)


class _Quiet:
    def update(self, n=1):
        pass

    def set_postfix_str(self, s):
        pass

    def close(self):
        pass


class _Prints(_Quiet):
    def __init__(self, total, desc):
        self.total, self.desc, self.n, self.last = total, desc, 0, ""

    def update(self, n=1):
        self.n += n
        if self.n == self.total or self.n % max(1, self.total // 10) == 0:
            print(f"{self.desc}: {self.n}/{self.total} {self.last}", flush=True)

    def set_postfix_str(self, s):
        self.last = s


def train(shape, recipe, corpus, *, progress=False, desc="train"):
    """A model of ``shape`` trained by ``recipe`` on ``corpus`` (bytes), in eval mode."""
    torch, _ = transformers_stack()
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    try:
        torch.manual_seed(recipe.seed)
        model = build(shape)
        data = torch.frombuffer(bytearray(corpus), dtype=torch.uint8).long()
        gen = torch.Generator().manual_seed(recipe.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 1.0 - 0.9 * s / max(1, recipe.steps))
        offsets = torch.arange(recipe.seq_len + 1)
        model.train()
        bar = _progress(recipe.steps, desc, progress)
        for _ in range(recipe.steps):
            starts = torch.randint(0, data.numel() - recipe.seq_len - 1, (recipe.batch_size, 1),
                                   generator=gen)
            window = data[starts + offsets]
            loss = model(input_ids=window[:, :-1], labels=window[:, :-1]).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            bar.set_postfix_str(f"loss {loss.item():.3f}")
            bar.update(1)
        bar.close()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def load_pair(recipe=TEST_RECIPE, *, cache_dir=None, progress=False):
    """(target, draft): the recipe's two trained models, in eval mode, on the CPU.

    Loads them from the cache when the recipe's key is there; otherwise trains
    both (target first) and stores them (written to a temporary directory and
    renamed into place, so a concurrent or interrupted run never leaves a
    partial entry).  ``progress`` shows training progress (tqdm where
    installed, plain prints otherwise).
    """
    _, transformers = transformers_stack()
    bars = transformers.utils.logging.is_progress_bar_enabled()
    if not progress:
        transformers.utils.logging.disable_progress_bar()
    try:
        return _load_pair(recipe, cache_dir, progress, transformers)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()


def _load_pair(recipe, cache_dir, progress, transformers):
    corpus = corpus_bytes(recipe)
    root = os.path.join(cache_root(cache_dir), "tiny-models")
    entry = os.path.join(root, recipe_key(recipe, corpus))
    if not os.path.isdir(entry):
        os.makedirs(root, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=root, prefix=".partial-")
        try:
            for name, shape in (("target", recipe.target), ("draft", recipe.draft)):
                start = time.perf_counter()
                model = train(shape, recipe, corpus, progress=progress, desc=f"train {name}")
                model.save_pretrained(os.path.join(tmp, name))
                if progress:
                    print(f"trained {name} in {time.perf_counter() - start:.1f} s", flush=True)
            try:
                os.rename(tmp, entry)
            except OSError:  # another process stored the same key first
                if not os.path.isdir(entry):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return tuple(transformers.GPT2LMHeadModel.from_pretrained(os.path.join(entry, name)).eval()
                 for name in ("target", "draft"))


def encode(text):
    """Token ids of ``text``: its UTF-8 bytes (a list of ints in [0, 256))."""
    return list(text.encode("utf-8"))


def decode(ids):
    """Text of byte token ids (invalid UTF-8 shown with replacement characters)."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
