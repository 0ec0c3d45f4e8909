"""What users would write instead: plain NumPy and plain PyTorch pipelines.

Each ``make_*`` returns a zero-argument callable doing the whole job on
inputs prepared beforehand (conversion and transfers are not timed).
"""

import numpy as np

TOTAL = 1 << 24


# ------------------------------------------------------------------ NumPy

def numpy_allocate(inp):
    """float64 largest-remainder allocation of 2**24 tickets."""
    p = inp.p

    def run():
        w = p.astype(np.float64)
        s = w / w.sum(axis=1, keepdims=True) * TOTAL
        f = np.floor(s)
        rem = s - f
        short = (TOTAL - f.sum(axis=1)).astype(np.int64)
        order = np.argsort(-rem, axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(p.shape[1])[None, :], axis=1)
        return (f + (rank < short[:, None])).astype(np.uint32)
    return run


def numpy_propose(inp):
    """top-k -> softmax(v / T) -> inverse-CDF sample -> gather."""
    z, k, t = inp.logits, min(inp.top_k, inp.vocab), inp.temperature
    rng = np.random.default_rng(0)

    def run():
        idx = np.argpartition(-z, k - 1, axis=1)[:, :k]
        v = np.take_along_axis(z, idx, axis=1) / t
        e = np.exp(v - v.max(axis=1, keepdims=True))
        cdf = np.cumsum(e, axis=1)
        u = rng.random((z.shape[0], 1)) * cdf[:, -1:]
        j = np.minimum((cdf <= u).sum(axis=1), k - 1)
        return np.take_along_axis(idx, j[:, None], axis=1)[:, 0]
    return run


def numpy_draw(inp):
    q = inp.p
    rng = np.random.default_rng(0)

    def run():
        cdf = np.cumsum(q, axis=1)
        u = rng.random((q.shape[0], 1)) * cdf[:, -1:]
        return np.minimum((cdf <= u).sum(axis=1), q.shape[1] - 1)
    return run


def numpy_verify(inp):
    """gather, ratio test, clamp(p - q, 0), resample (inverse CDF)."""
    p, q, d, k = inp.p, inp.qp, inp.draft, inp.k
    rng = np.random.default_rng(0)
    b = p.shape[0]
    rows = np.arange(b)

    def run():
        pd = np.take_along_axis(p[:, :k], d[..., None], axis=2)[..., 0]
        qd = np.take_along_axis(q, d[..., None], axis=2)[..., 0]
        ok = rng.random((b, k)) * qd < pd
        n = np.where(ok.all(axis=1), k, np.argmin(ok, axis=1))
        resid = np.maximum(p[:, :k] - q, 0.0)
        row = np.where((n < k)[:, None], resid[rows, np.minimum(n, k - 1)], p[rows, k])
        cdf = np.cumsum(row, axis=1)
        u = rng.random((b, 1)) * cdf[:, -1:]
        tok = np.minimum((cdf <= u).sum(axis=1), p.shape[2] - 1)
        return n, tok
    return run


# ------------------------------------------------------------------ PyTorch

def torch_inputs(inp, device):
    import torch

    out = {}
    for name in ("p", "qp", "logits"):
        a = getattr(inp, name, None)
        if a is not None:
            t = torch.from_numpy(a).to(device)
            if name == "logits" and device != "cpu":
                t = t.to(torch.bfloat16)
            out[name] = t
    if getattr(inp, "draft", None) is not None:
        out["draft"] = torch.from_numpy(inp.draft.astype(np.int64)).to(device)
    return out


def torch_allocate(inp, device="cpu"):
    import torch

    t = torch_inputs(inp, device)
    p = t["p"]

    def run():
        w = p.double()
        s = w / w.sum(dim=1, keepdim=True) * TOTAL
        f = torch.floor(s)
        rem = s - f
        short = (TOTAL - f.sum(dim=1)).long()
        order = torch.argsort(rem, dim=1, descending=True, stable=True)
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(p.shape[1], device=p.device).expand_as(order))
        return (f + (rank < short[:, None])).to(torch.int32)
    return run


def torch_propose(inp, device="cpu"):
    import torch

    z = torch_inputs(inp, device)["logits"]
    k, t = min(inp.top_k, inp.vocab), inp.temperature

    def run():
        v, idx = torch.topk(z, k, dim=1)
        probs = torch.softmax(v.float() / t, dim=1)
        j = torch.multinomial(probs, 1)
        return torch.gather(idx, 1, j)
    return run


def torch_draw(inp, device="cpu"):
    import torch

    q = torch_inputs(inp, device)["p"]

    def run():
        return torch.multinomial(q, 1)
    return run


def torch_verify(inp, device="cpu"):
    """gather, ratio test, clamp(p - q, 0), exponential race, argmax."""
    import torch

    t = torch_inputs(inp, device)
    p, q, d, k = t["p"], t["qp"], t["draft"], inp.k
    b = p.shape[0]
    rows = torch.arange(b, device=p.device)

    def run():
        pd = torch.gather(p[:, :k], 2, d[..., None])[..., 0]
        qd = torch.gather(q, 2, d[..., None])[..., 0]
        ok = torch.rand((b, k), device=p.device) * qd < pd
        allok = ok.all(dim=1)
        n = torch.where(allok, torch.full_like(rows, k), (~ok).int().argmax(dim=1))
        resid = torch.clamp(p[:, :k] - q, min=0)
        dist = torch.cat([resid, p[:, k:]], dim=1)[rows, n]
        race = dist / torch.empty_like(dist).exponential_()
        return n, race.argmax(dim=1)
    return run


NUMPY = {"allocate": numpy_allocate, "propose": numpy_propose, "draw": numpy_draw,
         "verify": numpy_verify}
TORCH = {"allocate": torch_allocate, "propose": torch_propose, "draw": torch_draw,
         "verify": torch_verify}
