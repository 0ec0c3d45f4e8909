"""Speculative decoding end to end with Hugging Face transformers models and dyadic.

Trains (or loads from the cache) a small byte-level GPT-2 target and a smaller
draft on Python's own standard-library sources, then generates the same
requests twice: target-only sampling (``dyadic.integrations.transformers.sample``)
and speculative generation (``generate``: the draft proposes with
``dyadic.propose``, the target verifies with ``dyadic.verify``).  Prints the
texts, the acceptance rate per draft position, the mean accepted length and
the tokens per second of each, checks the guarantees that hold on any machine
(batch invariance; greedy speculation equals the target's greedy output), and
writes ``summary.json`` and ``speculative.png`` to the output directory.

Run: python examples/speculative_decoding.py [--out speculative-out] [--num-drafts 4]

Needs ``pip install 'dyadic[examples]'`` (torch, transformers, matplotlib for the
plot, tqdm for progress bars; with only ``dyadic[transformers]`` it runs without
the plot and prints plain progress lines).  No download:
the models are trained in-process (a minute or two on 2 CPU cores, once; the
weights are cached, see dyadic.integrations.tiny_models).
"""

import argparse
import json
import os
import platform
import time

import numpy as np

import dyadic
from dyadic.integrations import tiny_models
from dyadic.integrations import transformers as dyt

PROMPTS = [
    "def ",
    "class ",
    "    def __init__(self, ",
    "import ",
    "        return ",
    "    if ",
    "for i in ",
    "    # ",
]


def bar(total, desc):
    """A tqdm bar where installed, plain prints otherwise."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _PrintBar(total, desc)
    return tqdm(total=total, desc=desc)


class _PrintBar:
    def __init__(self, total, desc):
        self.total, self.desc, self.n = total, desc, 0

    def update(self, n=1):
        self.n += n
        print(f"{self.desc}: {self.n}/{self.total}", flush=True)

    def close(self):
        pass


def run_requests(fn, prompts, seeds, desc):
    """Each request alone (batch 1, the latency-bound case speculation is for):
    (outputs, seconds per request)."""
    outs, secs = [], []
    progress = bar(len(prompts), desc)
    for p, s in zip(prompts, seeds):
        start = time.perf_counter()
        outs.append(fn([p], [s]))
        secs.append(time.perf_counter() - start)
        progress.update(1)
    progress.close()
    return outs, secs


def merged_stats(outs):
    return dyt.AcceptanceStats(outs[0].stats.num_drafts,
                               np.concatenate([o.stats.rounds for o in outs]),
                               np.concatenate([o.stats.accepted for o in outs]))


def plot(path, rate, ms_plain, ms_spec, k):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar(np.arange(k), rate, color="tab:blue")
    ax1.set_xticks(np.arange(k))
    ax1.set_xlabel("draft position i")
    ax1.set_ylabel("P(accept draft i | drafts < i accepted)")
    ax1.set_ylim(0, 1)
    ax1.set_title("acceptance by draft position")
    x = np.arange(len(ms_plain))
    ax2.bar(x - 0.2, ms_plain, width=0.4, label="target only")
    ax2.bar(x + 0.2, ms_spec, width=0.4, label=f"speculative, k={k}")
    ax2.set_xlabel("request")
    ax2.set_ylabel("ms per generated token")
    ax2.set_title("time per generated token")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="speculative-out", help="output directory")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--num-drafts", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--draft-temperature", type=float, default=0.7)
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0, help="request b uses seed + b")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--recipe", choices=["example", "test"], default="example",
                    help="the model pair (test: the smaller pair the test suite trains)")
    ap.add_argument("--cache-dir", default=None, help="weights cache (default: user cache)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for generation (models this small run fastest on one)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import torch
    import transformers

    torch.set_num_threads(args.threads)

    recipe = tiny_models.EXAMPLE_RECIPE if args.recipe == "example" else tiny_models.TEST_RECIPE
    start = time.perf_counter()
    target, draft = tiny_models.load_pair(recipe, cache_dir=args.cache_dir, progress=True)
    load_s = time.perf_counter() - start
    print(f"models ready in {load_s:.1f} s (target {target.num_parameters():,} parameters, "
          f"draft {draft.num_parameters():,})")

    prompts = [tiny_models.encode(p) for p in PROMPTS]
    seeds = [args.seed + b for b in range(len(prompts))]
    common = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                  top_k=args.top_k, backend=args.backend)
    spec_kw = dict(common, num_drafts=args.num_drafts, draft_temperature=args.draft_temperature)

    def plain(p, s):
        return dyt.sample(target, p, seed=s, **common)

    def spec(p, s):
        return dyt.generate(target, draft, p, seed=s, **spec_kw)

    plain(prompts[:1], seeds[:1])  # warm-up (first-call overheads), not timed
    spec(prompts[:1], seeds[:1])
    plain_out, plain_s = run_requests(plain, prompts, seeds, "target only")
    spec_out, spec_s = run_requests(spec, prompts, seeds, "speculative")

    # Guarantees that hold on any machine: the batch gives each request's own tokens ...
    batched = dyt.generate(target, draft, prompts, seed=seeds, **spec_kw)
    assert batched.new_tokens == [o.new_tokens[0] for o in spec_out]
    # ... and greedy speculation is the target's greedy output token for token.
    greedy = dict(max_new_tokens=args.max_new_tokens, temperature=0.0, backend=args.backend)
    g_spec = dyt.generate(target, draft, prompts, seed=seeds, num_drafts=args.num_drafts, **greedy)
    g_plain = dyt.sample(target, prompts, seed=seeds, **greedy)
    assert g_spec.new_tokens == g_plain.new_tokens

    stats = merged_stats(spec_out)
    rate = stats.acceptance_by_position()
    n_tokens = args.max_new_tokens * len(prompts)
    ms_plain = [1e3 * s / args.max_new_tokens for s in plain_s]
    ms_spec = [1e3 * s / args.max_new_tokens for s in spec_s]
    for text, po, so in zip(PROMPTS, plain_out, spec_out):
        print(f"\n--- prompt {text!r}\n[target only] {tiny_models.decode(po.new_tokens[0])!r}"
              f"\n[speculative] {tiny_models.decode(so.new_tokens[0])!r}")
    print(f"\nacceptance by draft position: {np.round(rate, 3).tolist()}")
    print(f"mean accepted drafts per round: {stats.mean_accepted():.2f} of {args.num_drafts} "
          f"({stats.mean_accepted() + 1:.2f} tokens per target forward)")
    print(f"greedy: {g_spec.stats.mean_accepted():.2f} accepted per round; "
          f"greedy speculative output == target greedy output: True")
    tps_plain, tps_spec = n_tokens / sum(plain_s), n_tokens / sum(spec_s)
    print(f"target only: {tps_plain:.1f} tokens/s; speculative: {tps_spec:.1f} tokens/s "
          f"(x{tps_spec / tps_plain:.2f})")

    png = plot(os.path.join(args.out, "speculative.png"), rate, ms_plain, ms_spec,
               args.num_drafts)
    summary = {
        "recipe": args.recipe, "target_parameters": target.num_parameters(),
        "draft_parameters": draft.num_parameters(), "model_load_or_train_s": load_s,
        "num_drafts": args.num_drafts, "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature, "draft_temperature": args.draft_temperature,
        "top_k": args.top_k, "backend": args.backend, "seeds": seeds, "threads": args.threads,
        "versions": {"dyadic": dyadic.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "target_only": {"tokens_per_s": tps_plain, "ms_per_token": ms_plain,
                        "texts": [tiny_models.decode(o.new_tokens[0]) for o in plain_out]},
        "speculative": {"tokens_per_s": tps_spec, "ms_per_token": ms_spec,
                        "acceptance_by_position": rate.tolist(),
                        "mean_accepted": stats.mean_accepted(),
                        "rounds": stats.rounds.tolist(), "accepted": stats.accepted.tolist(),
                        "texts": [tiny_models.decode(o.new_tokens[0]) for o in spec_out]},
        "greedy_speculative_equals_target_greedy": True,
        "batched_equals_per_request": True,
        "plot": png,
    }
    path = os.path.join(args.out, "summary.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=2)
    print(f"wrote {path}" + (f" and {png}" if png else ""))


if __name__ == "__main__":
    main()
