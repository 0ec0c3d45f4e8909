/* ========================================================================
 * da2_*: the four dense launches (state, arithmetic and selection in
 * dense_alloc.cuh: DaRow, da_div, the weight functors, da_pick, da_fallback).
 * Faster on the H200 than the same arithmetic in plain loops (docs/performance.md).
 * What these do:
 *  - da2_vec: software-pipelined float4 tile loop: the loads of iteration
 *    k + 1 are issued before the elements of iteration k are processed (a
 *    plain loop waits for every batch: ~4 exposed memory latencies per block
 *    at B=64).  Same element -> thread map, same per-thread id order.
 *  - da2_mark: the per-element loop is instantiated per row kind (FLOOR/ALL,
 *    CAND, FALL; row-uniform, chosen outside the loop): no dead per-element
 *    work (argmax compare, ballot, range) and fewer live registers; the
 *    last-block work (da_pick / da_fallback) is a noinline function.
 *  - counts are stored with st.global.cs (evict-first): the 33 MB of counts
 *    (B=64) do not push x out of L2.
 * Non-vector inputs (float16 / bfloat16, unaligned) use da_tile's scalar loop.
 * ======================================================================== */

/* 16-byte read-only load with an L2 eviction hint.  H = 1: evict_last (max, sum,
 * floor: x is read again by the next launch), H = 2: evict_first (mark: the last
 * read; the lines do not stay pinned after the call).  Bits only (no float ops).
 * volatile: never speculated past its guard (i < hi, vec). */
template <int H>
DC_FN float4 da2_ld(const float4* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u64 pol;
  if (H == 1) asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  else asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  u32 a, b, c, d;
  asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p), "l"(pol));
  return make_float4(__uint_as_float(a), __uint_as_float(b), __uint_as_float(c), __uint_as_float(d));
#else
  return __ldg(p);
#endif
}

/* the first batch of da2_vec (U float4 per thread; zeros where !vec or past hi) */
template <int U, int H>
DC_FN void da2_first(float4 (&b)[U], const void* x, i64 xoff, int lo, int hi, int vec) {
  const float4* x4 = (const float4*)((const float*)x + xoff);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = lo + (u * 256 + (int)threadIdx.x) * 4;
    b[u] = vec && i < hi ? da2_ld<H>(&x4[i >> 2]) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

/* f(v0, xs, DaN<4>, ok) over [lo, hi) of a float32 row, U float4 per thread per
 * iteration, the next iteration's loads in flight while f runs; b holds the
 * first batch (da2_first, issued at the kernel's entry, in flight while the
 * kernel reads the row state).  Same element -> thread map and per-thread id
 * order as da_tile: lo is a multiple of 4 and hi == V or a multiple of 1024,
 * V % 4 == 0, so i < hi implies i + 3 < hi.  Every thread makes the same number
 * of calls. */
template <int U, int H, class F>
DC_FN void da2_vec(const float* x, i64 xoff, int lo, int hi, float4 (&b)[U], F f) {
  const int tid = threadIdx.x;
  const float4* x4 = (const float4*)(x + xoff);
  constexpr int ST = 256 * 4 * U;
  for (int base = lo; base < hi; base += ST) {
    float4 c[U];
#pragma unroll
    for (int u = 0; u < U; ++u) c[u] = b[u];
    const int nb = base + ST;
    if (nb < hi) {  /* block-uniform */
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = nb + (u * 256 + tid) * 4;
        b[u] = i < hi ? da2_ld<H>(&x4[i >> 2]) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + (u * 256 + tid) * 4;
      const float xs[4] = {c[u].x, c[u].y, c[u].z, c[u].w};
      f(i, xs, DaN<4>(), i < hi);
    }
  }
}

template <int U, int H = 1, class F>
DC_FN void da2_tile(const void* x, int xdt, i64 xoff, int lo, int hi, int vec, float4 (&b)[U], F f) {
  if (vec) da2_vec<U, H>((const float*)x, xoff, lo, hi, b, f);
  else da_tile<U>(x, xdt, xoff, lo, hi, 0, f);
}

extern "C" __global__ void __launch_bounds__(256, 4) da2_max(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int dt, int vec, u64* state, int nrows) {
  __shared__ DcShared sh;
  const int row = dc_grid_row();
  if (row >= nrows) return;
  bool greedy; const double T = row_temp(temp, row, greedy_ok, &greedy);
  const i64 xoff = (i64)row * V, boff = bias_rows > 1 ? xoff : 0;
  u64* st = state + (i64)row * DA_RS;
  const int lo = blockIdx.x * dt, hi = min(V, lo + dt);
  u64 mk = 0, nb = 0;
  auto body = [&](int v0, const float* xs, auto NN, bool ok) {
    constexpr int n = decltype(NN)::n;
    if (!ok) return;
#pragma unroll
    for (int e = 0; e < n; ++e) {
      int bad;
      const u64 key = rank_key(xs[e], bias, bdt, boff + v0 + e, T, logits, &bad);
      if (bad && nb == 0) nb = ~(((u64)(v0 + e) << 8) | (u64)bad);
      mk = key > mk ? key : mk;
    }
  };
  if (logits) {
    float4 pre[2];
    da2_first<2, 1>(pre, x, xoff, lo, hi, vec);
    da2_tile<2>(x, xdt, xoff, lo, hi, vec, pre, body);
  }
  else {  /* probabilities: the same key (mag + 1) and status; the argmax here too: the
    * largest mag << 32 | ~id is the lowest id of the largest magnitude (da2_sum's is_max
    * test, not run for probabilities), kept in DA_ARG (da2_mark reads its low 32 bits) */
    u64 pm = 0;
    auto pb = [&](int v0, const float* xs, auto NN, bool ok) {
      constexpr int n = decltype(NN)::n;
      if (!ok) return;
#pragma unroll
      for (int e = 0; e < n; ++e) {
        const u32 b = __float_as_uint(xs[e]), mag = b & 0x7FFFFFFFu;
        if (!(b - 1u < 0x7F7FFFFFu || mag == 0) && nb == 0)
          nb = ~(((u64)(v0 + e) << 8) | (u64)dy_weight_bits_status(b));
        const u64 key = ((u64)mag << 32) | (u64)(u32)~(u32)(v0 + e);
        pm = key > pm ? key : pm;
      }
    };
    float4 pre4[4];
    da2_first<4, 1>(pre4, x, xoff, lo, hi, vec);
    da2_tile<4>(x, xdt, xoff, lo, hi, vec, pre4, pb);
    mk = pm;
  }
  mk = block_reduce64(mk, 1, sh);
  nb = block_reduce64(nb, 1, sh);
  if (threadIdx.x == 0) {
    if (logits) atomicMax(&st[DA_MK], mk);
    else { atomicMax(&st[DA_MK], (mk >> 32) + 1); atomicMax(&st[DA_ARG], mk); }
    if (nb) atomicMax(&st[DA_BAD], nb);
  }
}

extern "C" __global__ void __launch_bounds__(256, 4) da2_sum(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int dt, int vec, u64* state, int nrows) {
  __shared__ DcShared sh;
  const int row = dc_grid_row();
  if (row >= nrows) return;
  float4 pre[2];  /* the first batch of the tile, in flight while the row state is read */
  da2_first<2, 1>(pre, x, (i64)row * V, blockIdx.x * dt, min(V, (int)blockIdx.x * dt + dt), vec);
  u64* st = state + (i64)row * DA_RS;
  if (da_code(st, logits)) return;
  bool greedy; const double T = row_temp(temp, row, greedy_ok, &greedy);
  const i64 xoff = (i64)row * V, boff = bias_rows > 1 ? xoff : 0;
  const u64 mk = st[DA_MK];
  const int lo = blockIdx.x * dt, hi = min(V, lo + dt);
  u64 S = 0, na = 0;
  da_kind(logits, mk, bias, bdt, boff, T, [&](auto W) {
    da2_tile<2>(x, xdt, xoff, lo, hi, vec, pre, [&](int v0, const float* xs, auto NN, bool ok) {
      constexpr int n = decltype(NN)::n;
      if (!ok) return;
#pragma unroll
      for (int e = 0; e < n; ++e) {
        if (!W.arg_in_max() && na == 0 && W.is_max(xs[e], v0 + e)) na = ~(u64)(v0 + e);
        if (!greedy) S += W(xs[e], v0 + e);
      }
    });
  });
  na = block_reduce64(na, 1, sh);
  S = block_reduce64(S, 0, sh);
  if (threadIdx.x == 0) { if (na) atomicMax(&st[DA_ARG], na); if (!greedy) atomicAdd(&st[DA_S], S); }
}

/* the floor stage (dense_alloc.cuh's header), with the pipelined tile loop */
extern "C" __global__ void __launch_bounds__(256, 4) da2_floor(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int dt, int vec, int policy, u32* __restrict__ fine,
    u64* state, int nrows) {
  __shared__ DcShared sh;
  __shared__ u32 hs[DA_NB];
  __shared__ u32 f8[8];
  __shared__ int sbin, sneed, scnt;
  const int row = dc_grid_row(), tid = threadIdx.x;
  if (row >= nrows) return;
  float4 pre[2];  /* the first batch of the tile, in flight while the row state is read */
  da2_first<2, 1>(pre, x, (i64)row * V, blockIdx.x * dt, min(V, (int)blockIdx.x * dt + dt), vec);
  u64* st = state + (i64)row * DA_RS;
  if (da_code(st, logits)) return;
  bool greedy; const double T = row_temp(temp, row, greedy_ok, &greedy);
  if (greedy) return;
  const i64 xoff = (i64)row * V, boff = bias_rows > 1 ? xoff : 0;
  const DaRow R = da_row(st, logits);
  if (R.S == 0) return;
  const int lo = blockIdx.x * dt, hi = min(V, lo + dt);
  const bool hist = policy == 0;
  for (int j = tid; j < DA_NB; j += 256) hs[j] = 0;
  __syncthreads();
  u32 sbt = 0;
  da_kind(logits, R.mk, bias, bdt, boff, T, [&](auto W) {
    da2_tile<2>(x, xdt, xoff, lo, hi, vec, pre, [&](int v0, const float* xs, auto NN, bool ok) {
      constexpr int n = decltype(NN)::n;
      if (!ok) return;
#pragma unroll
      for (int e = 0; e < n; ++e) {
        u64 r;
        sbt += da_div(R, W(xs[e], v0 + e), &r);
        if (hist) {
          atomicAdd(&hs[(u32)(r >> R.dlo)], 1u);
        }
      }
    });
  });
  const u64 sb = block_reduce64(sbt, 0, sh);
  if (tid == 0) atomicAdd(&st[DA_SB], sb);
  u32* gh = (u32*)(st + 16);
  const int ntiles = (int)gridDim.x;
  if (hist) {
    u32* fb = fine + ((i64)row * ntiles + blockIdx.x) * DA_NB;
    for (int j = tid; j < DA_NB; j += 256) fb[j] = hs[j];
    u32 cs = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) cs += hs[8 * tid + k];
    if (cs) atomicAdd(&gh[tid], cs);
  }
  if (!da_last(st, DA_C1)) return;
  /* ---- last block of the row ---- */
  const i64 remaining = (i64)DY_TOTAL - (i64)__ldcg(&st[DA_SB]);
  int kind, code = 0;
  if (remaining < 0 || remaining >= (i64)DY_TOTAL) { kind = DA_K_ERR; code = DY_ST_ALLOC_INCONSISTENT; }
  else if (remaining == 0 || !hist) kind = DA_K_FLOOR;
  else kind = DA_K_CAND;
  if (kind == DA_K_CAND) {
    const int need = (int)remaining;
    const int cb = DA_NC - 1 - tid;
    const int c = (int)__ldcg(&gh[cb]);
    if (tid == 0) sbin = -1;
    if (tid < 8) f8[tid] = 0;
    int tot; const int exc = block_excl_scan(c, &tot, sh);
    if (exc < need && need <= exc + c) { sbin = cb; sneed = need - exc; }
    __syncthreads();
    const int cbin = sbin, needc = sneed;
    if (cbin >= 0) {
      for (int i = tid; i < 8 * ntiles; i += 256)
        atomicAdd(&f8[i & 7], __ldcg(&fine[((i64)row * ntiles + (i >> 3)) * DA_NB + 8 * cbin + (i & 7)]));
      __syncthreads();
      if (tid == 0) {
        int cum = 0;
        sbin = -1;
        for (int k = 7; k >= 0; --k) {
          if (cum < needc && needc <= cum + (int)f8[k]) { sbin = 8 * cbin + k; sneed = needc - cum; scnt = (int)f8[k]; break; }
          cum += (int)f8[k];
        }
      }
    }
    __syncthreads();
    if (sbin < 0) { kind = DA_K_ERR; code = DY_ST_ALLOC_INCONSISTENT; }
    else if (sneed == scnt) kind = DA_K_ALL;
    else if (scnt > DA_CAP) kind = DA_K_FALL;
  }
  if (hist) gh[tid] = 0;
  if (tid == 0) {
    st[DA_KIND] = (u64)kind;
    st[DA_CODE] = (u64)code;
    st[DA_REM] = remaining > 0 ? (u64)remaining : 0;
    if (kind >= DA_K_ALL) { st[DA_BIN] = (u64)sbin; st[DA_NEED] = (u64)sneed; st[DA_CNT] = (u64)scnt; }
  }
}

/* the mark stage's last-block work (the bin's +1 by da_pick / da_fallback), out of line */
static __device__ __noinline__ void da2_mark_tail(
    const void* x, int xdt, const void* bias, int bdt, i64 boff, double T, int logits, int V,
    i64 xoff, int kind, u64* st, const u64* cr, const u32* ci, u32* crow, DcShared& sh) {
  __shared__ u64 skr[DA_CAP];
  __shared__ u32 skid[DA_CAP];
  const int tid = threadIdx.x;
  const DaRow R = da_row(st, logits);
  const u32 bin = (u32)st[DA_BIN];
  if (kind == DA_K_CAND) {
    const int C = (int)min(__ldcg(&st[DA_SLOT]), (u64)DA_CAP);
    for (int i = tid; i < C; i += 256) { skr[i] = __ldcg(&cr[i]); skid[i] = __ldcg(&ci[i]); }
    __syncthreads();
    da_pick([&](int i) { return skr[i]; }, [&](int i) { return skid[i]; }, C, (int)st[DA_NEED],
            R.dlo, crow, sh);
  } else {
    da_fallback(x, xdt, bias, bdt, boff, T, logits, V, xoff, R, bin, (int)st[DA_NEED],
                __ldcg(&st[DA_RMAX]) == ~__ldcg(&st[DA_RMINI]), crow, sh);
  }
}

/* counts of [v0, v0 + n): evict-first stores (uint4 when aligned) */
template <int n>
DC_FN void da2_store(u32* crow, int v0, const u32* c, int cvec) {
  if (n == 4 && cvec) __stcs((uint4*)&crow[v0], make_uint4(c[0], c[n > 1 ? 1 : 0], c[n > 2 ? 2 : 0], c[n > 3 ? 3 : 0]));
  else {
#pragma unroll
    for (int e = 0; e < n; ++e) __stcs(&crow[v0 + e], c[e]);
  }
}

/* the mark stage (dense_alloc.cuh's header); the loop specialised per row kind */
extern "C" __global__ void __launch_bounds__(256, 4) da2_mark(
    const void* x, int xdt, const void* bias, int bdt, int bias_rows, const double* temp,
    int logits, int greedy_ok, int V, int dt, int vec, int policy, u64* state,
    u64* __restrict__ cand_r, u32* __restrict__ cand_i, u32* __restrict__ counts, int cvec,
    int* status, int nrows) {
  __shared__ DcShared sh;
  const int row = dc_grid_row(), tid = threadIdx.x, lane = tid & 31;
  if (row >= nrows) return;
  float4 pre[2];  /* the first batch of the tile, in flight while the row state is read */
  da2_first<2, 2>(pre, x, (i64)row * V, blockIdx.x * dt, min(V, (int)blockIdx.x * dt + dt), vec);
  u64* st = state + (i64)row * DA_RS;
  const i64 xoff = (i64)row * V, boff = bias_rows > 1 ? xoff : 0;
  u32* crow = counts + xoff;
  u64* cr = cand_r + (i64)row * DA_CAP;
  u32* ci = cand_i + (i64)row * DA_CAP;
  const int lo = blockIdx.x * dt, hi = min(V, lo + dt);
  bool greedy; const double T = row_temp(temp, row, greedy_ok, &greedy);
  int code = da_code(st, logits);
  const int kind = code ? 0 : (int)st[DA_KIND];
  if (!code && kind == DA_K_ERR) code = (int)st[DA_CODE];
  const int argmax = (int)~st[DA_ARG];
  const DaRow R = da_row(st, logits);
  if (!code && !greedy && (kind < DA_K_ERR || kind > DA_K_FALL))
    code = R.S == 0 ? DY_ST_X_ZERO_MASS : DY_ST_ALLOC_INCONSISTENT;
  const u32 bin = (u32)st[DA_BIN];
  const u64 rbase = (u64)bin << R.dlo;
  if (code || greedy) {
    const u32 one = code ? 0u : DY_TOTAL;
    for (int v = lo + tid; v < hi; v += 256) __stcs(&crow[v], v == argmax ? one : 0u);
  } else if (kind == DA_K_CAND) {
    /* q + [d > bin]; the bin's elements appended (warp-aggregated slot).  The common
     * path keeps one bit per element (d == bin) and votes once per group; the append
     * (ballot, slot, r computed again) runs only for the groups where some lane of the
     * warp has such an element (faster on the H200 at B = 64 than a ballot per element;
     * ptxas reports spill stores for this kernel). */
    const u32 thr = bin + 1;
    da_kind(logits, R.mk, bias, bdt, boff, T, [&](auto W) {
      da2_tile<2, 2>(x, xdt, xoff, lo, hi, vec, pre, [&](int v0, const float* xs, auto NN, bool ok) {
        constexpr int n = decltype(NN)::n;
        u32 c[n];
        u32 inbin = 0;
#pragma unroll
        for (int e = 0; e < n; ++e) {
          u64 r;
          const u32 q = da_div(R, W(xs[e], ok ? v0 + e : lo), &r);  /* no bias read past hi */
          const u32 d = (u32)(r >> R.dlo);
          c[e] = q + (d >= thr ? 1u : 0u);
          inbin |= (ok && d == bin ? 1u : 0u) << e;
        }
        if (__any_sync(0xffffffffu, inbin)) {
#pragma unroll
          for (int e = 0; e < n; ++e) {
            const bool is = (inbin >> e) & 1u;
            const unsigned bal = __ballot_sync(0xffffffffu, is);
            if (!bal) continue;
            const int leader = __ffs(bal) - 1;
            u32 base = 0;
            if (lane == leader) base = (u32)atomicAdd(&st[DA_SLOT], (u64)__popc(bal));
            base = __shfl_sync(0xffffffffu, base, leader);
            if (is) {
              const int v = v0 + e;
              u64 r;
              da_div(R, W(xs[e], v), &r);
              const u32 p = base + (u32)__popc(bal & ((1u << lane) - 1u));
              if (p < DA_CAP) { cr[p] = r - rbase; ci[p] = (u32)v; }
            }
          }
        }
        if (ok) da2_store<n>(crow, v0, c, cvec);
      });
    });
  } else if (kind == DA_K_FALL) {
    /* q + [d > bin]; the range of r over the bin's elements */
    const u32 thr = bin + 1;
    u64 rmax = 0, rmin = ~0ull;
    da_kind(logits, R.mk, bias, bdt, boff, T, [&](auto W) {
      da2_tile<2, 2>(x, xdt, xoff, lo, hi, vec, pre, [&](int v0, const float* xs, auto NN, bool ok) {
        constexpr int n = decltype(NN)::n;
        if (!ok) return;
        u32 c[n];
#pragma unroll
        for (int e = 0; e < n; ++e) {
          u64 r;
          const u32 q = da_div(R, W(xs[e], v0 + e), &r);
          const u32 d = (u32)(r >> R.dlo);
          c[e] = q + (d >= thr ? 1u : 0u);
          if (d == bin) { rmax = r > rmax ? r : rmax; rmin = r < rmin ? r : rmin; }
        }
        da2_store<n>(crow, v0, c, cvec);
      });
    });
    rmax = block_reduce64(rmax, 1, sh);
    rmin = block_reduce64(rmin, 2, sh);
    if (tid == 0) { atomicMax(&st[DA_RMAX], rmax); atomicMax(&st[DA_RMINI], ~rmin); }
  } else {
    /* FLOOR: q (+ remaining at the argmax); ALL: q + [d >= bin] */
    const u32 thr = kind == DA_K_FLOOR ? 0xFFFFFFFFu : bin;
    const u32 radd = kind == DA_K_FLOOR ? (u32)st[DA_REM] : 0u;
    da_kind(logits, R.mk, bias, bdt, boff, T, [&](auto W) {
      da2_tile<2, 2>(x, xdt, xoff, lo, hi, vec, pre, [&](int v0, const float* xs, auto NN, bool ok) {
        constexpr int n = decltype(NN)::n;
        if (!ok) return;
        u32 c[n];
#pragma unroll
        for (int e = 0; e < n; ++e) {
          const int v = v0 + e;
          u64 r;
          const u32 q = da_div(R, W(xs[e], v), &r);
          const u32 d = (u32)(r >> R.dlo);
          c[e] = q + (d >= thr ? 1u : 0u) + (v == argmax ? radd : 0u);
        }
        da2_store<n>(crow, v0, c, cvec);
      });
    });
  }
  if (!da_last(st, DA_C2)) return;
  /* ---- last block of the row: the bin's +1, status, state reset ---- */
  if (tid == 0) status[row] = code;
  if (!code && !greedy && (kind == DA_K_CAND || kind == DA_K_FALL))
    da2_mark_tail(x, xdt, bias, bdt, boff, T, logits, V, xoff, kind, st, cr, ci, crow, sh);
  __syncthreads();
  if (tid < 16) st[tid] = 0;
}
