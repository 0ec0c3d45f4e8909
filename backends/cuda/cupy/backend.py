"""CupyBackend: the backend interface (dyadic._backend.Backend) on the CUDA kernels.

Every method turns its arrays into device pointers (args.Call: device arrays in place,
NumPy arrays copied to the device and results back), finds the launch plan of the
call's configuration (plans.py; the route from routes.py) and launches it on CuPy's
current stream (dyadic._gpu_arrays makes that the caller's torch stream).  Device
``x`` may be float32, float16 or bfloat16 (read in the kernels; exact); key arrays may
have 4- or 8-byte integer words and length B or 1.

The kernels check every id they address memory with (draft ids, sparse q ids, a sparse
draw row) and fail that row closed with its status (dyadic._device's docstring gives
the order); args.verify_shapes refuses the shapes they would index beyond, args.keys
(the one check of key arrays on this path: dyadic._device passes CUDA key tensors as
they are) key arrays of a length other than 1 or B or of words other than 4- or 8-byte
integers.
"""

from ...._backend import Backend, BackendUnavailable
from . import args as A, plans, routes, runtime


class CupyBackend(Backend):
    name = "cuda"
    has_lazy_verify = True
    has_logits_verify = True
    #: verify(logits=True) on device arrays (dyadic._device; kernels logits_*.cuh,
    #: verify_logits_*.cuh).
    device_logits_verify = True
    #: allocate / propose with top_p / min_p / per-row top_k on device arrays (top_k
    #: given; the topk_select route).
    device_logits_filters = True
    #: x / bias may be float16 or bfloat16 device arrays (read in the kernels).
    reads_half_precision = True
    #: propose / verify with check=False and out= launch only kernels on the
    #: caller's stream: they can be captured in a torch.cuda.CUDAGraph.
    graph_capturable = True

    def usable(self):
        try:
            return runtime.cupy().cuda.runtime.getDeviceCount() > 0
        except Exception:  # noqa: BLE001 - no driver / no device means unusable
            return False

    # -------------------------------------------------------------- philox
    def philox4x32(self, counters, keys, rounds, out):
        call = A.Call()
        n = int(counters.shape[0])
        args = (call(counters), call(keys), A.I32[int(rounds)], A.I32[n], call(out, True))
        runtime.kernel("philox_counters")(((n + 255) // 256,), (256,), args)
        call.finish()

    # ------------------------------------------------------- allocate/propose
    def _alloc(self, x, bias, temperature, logits, greedy_ok, policy, top_k, keys, tokens,
               counts, ids, status):
        call = A.Call()
        batch, v = x.shape  # Python ints (torch.Size, NumPy and CuPy shapes)
        x_code = A.x_code(x)  # x's dtype error first, then bias's
        if bias is None:
            bias_code = bias_rows = 0
        else:
            bias_code, bias_rows = int(A.x_code(bias)), int(bias.shape[0])
        do_draw = tokens is not None
        plan = plans.alloc_plan(runtime.device_id(), batch, v, int(top_k or 0), int(x_code),
                                bias_code, bias_rows, bool(logits), greedy_ok, policy,
                                int(do_draw))
        x_ptr, bias_ptr, temp_ptr = call.many((x, bias, temperature))
        kptrs, kfmt = A.keys(call, *keys, batch) if do_draw else (A.NO_KEYS, 0)
        plan.launch(x_ptr, bias_ptr, temp_ptr, kptrs, kfmt,
                    *call.many((tokens, counts, ids, status), True))
        if call.back:  # NumPy outputs to copy back
            call.finish()

    def allocate(self, x, bias, temperature, logits, policy, top_k, counts, ids, status):
        self._alloc(x, bias, temperature, logits, 0, policy, top_k, None, None, counts, ids,
                    status)

    def propose(self, x, bias, temperature, policy, top_k, seed, generation, round, position,
                tokens, counts, ids, status):
        self._alloc(x, bias, temperature, True, 1, policy, top_k,
                    (seed, generation, round, position), tokens, counts, ids, status)

    # ----------------------------------------------------------------- draw
    def draw(self, counts, ids, seed, generation, round, position, tokens):
        call = A.Call()
        batch, w = int(counts.shape[0]), int(counts.shape[1])
        if ids is not None and A.shape_of(ids) != A.shape_of(counts):
            raise ValueError(f"ids: shape {A.shape_of(ids)} must be counts' {A.shape_of(counts)}")
        if A.shape_of(tokens) != (batch,):
            raise ValueError(f"tokens: shape {A.shape_of(tokens)} must be ({batch},)")
        kptrs, kfmt = A.keys(call, seed, generation, round, position, batch)
        c, i, t = call.many((counts, ids)) + (call(tokens, True),)
        plans.draw_plan(runtime.device_id(), batch, w).launch(c, i, kptrs, kfmt, t)
        if call.back:  # NumPy outputs to copy back
            call.finish()

    # --------------------------------------------------------------- verify
    def _verify(self, target, draft, q_counts, q_ids, greedy, keys, outs, route_greedy, lazy,
                num_drafts=None):
        ins = (target, draft, q_counts, q_ids) + ((greedy,) if greedy is not None else ())
        batch, k, v, w, call, kptrs, kfmt, p_in, (a, tk, st) = A.verify_setup(
            target, q_counts, *keys, ins, outs)
        t, d, qc, qi = p_in[:4]
        g = p_in[4] if greedy is not None else A.NULL  # no flags: the plan's zero flags
        nd = A.num_drafts(call, num_drafts, batch) if num_drafts is not None else A.NULL
        plan = plans.verify_plan(runtime.device_id(), batch, k + 1, v, w, route_greedy, lazy)
        plan.launch(t, d, qc, qi, g, kptrs, kfmt, a, tk, st, nd)
        if call.back:  # NumPy outputs to copy back
            call.finish()

    def verify(self, target, draft, q_counts, q_ids, greedy, seed, generation, round,
               position, accepted, tokens, status, num_drafts=None):
        """verify with greedy flags (uint8 [B]): verify_chain + verify_residual."""
        self._verify(target, draft, q_counts, q_ids, greedy, (seed, generation, round, position),
                     (accepted, tokens, status), True, False, num_drafts)

    def verify_plain(self, target, draft, q_counts, q_ids, greedy, seed, generation, round,
                     position, accepted, tokens, status, num_drafts=None):
        """verify with no greedy request: verify_one_launch where its grid fits
        (routes.one_launch_tile), else the two launches (with the plan's zero flags;
        ``greedy`` is not read); ``num_drafts`` is read by either."""
        self._verify(target, draft, q_counts, q_ids, None, (seed, generation, round, position),
                     (accepted, tokens, status), False, False, num_drafts)

    def verify_lazy(self, target, draft, q_counts, q_ids, seed, generation, round, position,
                    accepted, tokens, status, num_drafts=None):
        """verify with check="lazy" (no greedy rows): verify_lazy in one launch; for V
        above routes.LAZY_MAX_V the route of verify_plain (full validation)."""
        self._verify(target, draft, q_counts, q_ids, None, (seed, generation, round, position),
                     (accepted, tokens, status), False, True, num_drafts)

    def verify_logits(self, target, draft, q_counts, q_ids, greedy, temperature, top_k, top_p,
                      min_p, seed, generation, round, position, accepted, tokens, status,
                      num_drafts=None):
        """verify(logits=True): logits_max, logits_hist, logits_resolve (x2), then
        logits_one_launch or logits_chain + logits_residual (routes.py).  target float32 /
        float16 / bfloat16 logits."""
        batch, k, v, w, call, kptrs, kfmt, p_in, (a, tk, st) = A.verify_setup(
            target, q_counts, seed, generation, round, position,
            (target, draft, q_counts, q_ids, greedy), (accepted, tokens, status))
        t, d, qc, qi, g = p_in
        params = A.logits_params(call, temperature, top_k, top_p, min_p, batch)
        nd = A.num_drafts(call, num_drafts, batch) if num_drafts is not None else A.NULL
        plan = plans.logits_verify_plan(runtime.device_id(), batch, k + 1, v, w,
                                        A.x_code(target), top_k is not None)
        plan.launch(t, *params, g, nd, d, qc, qi, kptrs, kfmt, a, tk, st)
        if call.back:  # NumPy outputs to copy back
            call.finish()

    # --------------------------------------------------------------- runners
    # dyadic._device's call plans: torch tensors in, the launch plan found once.
    def alloc_runner(self, batch, v, x_dtype, top_k, policy, logits, propose, filtered=False):
        if filtered and top_k > routes.FILTER_MAX_K:
            raise BackendUnavailable(
                f"top_k: backend 'cuda' applies top_p / min_p / a per-row top_k to sparse "
                f"widths up to {routes.FILTER_MAX_K}, got {top_k}; pass host arrays to "
                f"backend 'cpu', 'reference' or 'numba'")
        x_code = A.DT_CODES[str(x_dtype).replace("torch.", "")]
        dev, greedy_ok, do_draw = runtime.device_id(), int(propose), int(propose)
        launch = plans.alloc_plan(dev, batch, v, top_k, x_code, 0, 0, bool(logits), greedy_ok,
                                  policy, do_draw, filtered).launch
        keys_of, no_keys = A.keys, A.NO_KEYS

        def biased(bias):
            """The launch of a call with ``bias``: its dtype and rows are part of the
            launch configuration."""
            return plans.alloc_plan(dev, batch, v, top_k, x_code, int(A.x_code(bias)),
                                    int(bias.shape[0]), bool(logits), greedy_ok, policy,
                                    do_draw, filtered).launch

        if filtered:
            def run(x, bias, temp, keys, tokens, counts, ids, status, ftopk, ftopp, fminp):
                if bias is not None and not top_k:
                    raise BackendUnavailable(
                        "top_p / min_p with bias and without top_k (a dense support): backend "
                        "'cuda' has no kernels for it on GPU arrays; give top_k, use backend "
                        "'numba', or pass host arrays to backend 'cpu', 'reference' or 'numba'")
                go = launch if bias is None else biased(bias)
                if propose:
                    call = A.Call()  # holds what the key fields needed moved, for the launch
                    kptrs, kfmt = keys_of(call, *keys, batch)
                    tok = tokens.data_ptr()
                else:
                    kptrs, kfmt, tok = no_keys, 0, 0
                go(x.data_ptr(), 0 if bias is None else bias.data_ptr(), temp.data_ptr(),
                   kptrs, kfmt, tok, counts.data_ptr(), 0 if ids is None else ids.data_ptr(),
                   status.data_ptr(), 0 if ftopk is None else ftopk.data_ptr(),
                   ftopp.data_ptr(), fminp.data_ptr())
        elif propose:
            def run(x, bias, temp, keys, tokens, counts, ids, status):
                go = launch if bias is None else biased(bias)
                call = A.Call()  # holds what the key fields needed moved, for the launch
                kptrs, kfmt = keys_of(call, *keys, batch)
                go(x.data_ptr(), 0 if bias is None else bias.data_ptr(), temp.data_ptr(),
                   kptrs, kfmt, tokens.data_ptr(), counts.data_ptr(),
                   0 if ids is None else ids.data_ptr(), status.data_ptr())
        else:
            def run(x, bias, temp, keys, tokens, counts, ids, status):
                (launch if bias is None else biased(bias))(
                    x.data_ptr(), 0 if bias is None else bias.data_ptr(), temp.data_ptr(),
                    no_keys, 0, 0, counts.data_ptr(), 0 if ids is None else ids.data_ptr(),
                    status.data_ptr())
        return run

    def draw_runner(self, batch, width):
        launch = plans.draw_plan(runtime.device_id(), batch, width).launch
        keys_of = A.keys

        def run(counts, ids, keys, tokens):
            call = A.Call()  # holds what the key fields needed moved, for the launch
            kptrs, kfmt = keys_of(call, *keys, batch)
            launch(counts.data_ptr(), 0 if ids is None else ids.data_ptr(), kptrs, kfmt,
                   tokens.data_ptr())
        return run

    def verify_runner(self, batch, k1, v, width, greedy, lazy, ragged=False):
        if k1 - 1 > A.MAX_K_VERIFY:
            raise ValueError(f"draft: backend 'cuda' verifies at most {A.MAX_K_VERIFY} draft "
                             f"tokens per request, got k={k1 - 1}")
        launch = plans.verify_plan(runtime.device_id(), batch, k1, v, width, greedy,
                                   lazy).launch
        keys_of = A.keys

        def run(t, d, qc, qi, g, keys, a, tk, st, nd=None):
            # nd: num_drafts, an int32 [B] device tensor (dyadic._gpu_arrays._num_drafts),
            # read by the kernels only: no copy, no synchronisation
            call = A.Call()  # holds what the key fields needed moved, for the launch
            kptrs, kfmt = keys_of(call, *keys, batch)
            launch(t.data_ptr(), d.data_ptr(), 0 if qc is None else qc.data_ptr(),
                   0 if qi is None else qi.data_ptr(), g.data_ptr() if greedy else 0, kptrs,
                   kfmt, a.data_ptr(), tk.data_ptr(), st.data_ptr(),
                   0 if nd is None else nd.data_ptr())
        return run

    def verify_logits_runner(self, batch, k1, v, width, x_dtype, top_k=True):
        if k1 - 1 > A.MAX_K_VERIFY:
            raise ValueError(f"draft: backend 'cuda' verifies at most {A.MAX_K_VERIFY} draft "
                             f"tokens per request, got k={k1 - 1}")
        x_code = A.DT_CODES[str(x_dtype).replace("torch.", "")]
        launch = plans.logits_verify_plan(runtime.device_id(), batch, k1, v, width,
                                          x_code, top_k).launch
        keys_of = A.keys

        def run(t, d, qc, qi, g, params, keys, a, tk, st, nd=None):
            # params: temperature float64, top_k int64, top_p / min_p float32 device
            # tensors [B] (dyadic._gpu_arrays._logits_params); nd as verify_runner's
            call = A.Call()  # holds what the key fields needed moved, for the launch
            kptrs, kfmt = keys_of(call, *keys, batch)
            temp, topk, topp, minp = params
            launch(t.data_ptr(), temp.data_ptr(), topk.data_ptr(), topp.data_ptr(),
                   minp.data_ptr(), 0 if g is None else g.data_ptr(),
                   0 if nd is None else nd.data_ptr(), d.data_ptr(),
                   0 if qc is None else qc.data_ptr(), 0 if qi is None else qi.data_ptr(),
                   kptrs, kfmt, a.data_ptr(), tk.data_ptr(), st.data_ptr())
        return run
