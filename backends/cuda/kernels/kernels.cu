/* The CUDA backend's kernels, compiled by NVRTC with --fmad=false (see
 * docs/architecture.md for which kernel serves which primitive and
 * dyadic/reference/ for the specification).  Scalar integer work:
 * backends/include/dyadic_core.h (shared with the CPU backend); parallel
 * primitives: common.cuh. */
#include "common.cuh"
#include "draw.cuh"
#include "topk_select.cuh"
#include "verify_common.cuh"
#include "verify_classify.cuh"
#include "verify.cuh"
#include "verify_lazy.cuh"
#include "verify_one_launch.cuh"
#include "logits_common.cuh"
#include "logits_max.cuh"
#include "logits_hist.cuh"
#include "logits_resolve.cuh"
#include "verify_logits_chain.cuh"
#include "verify_logits_residual.cuh"
#include "verify_logits_one_launch.cuh"
#include "logits_filter.cuh"
#include "topk_onepass.cuh"
#include "topk_onepass_wide.cuh"
#include "topk_onepass_packed.cuh"
#include "dense.cuh"
