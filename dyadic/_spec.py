"""Constants of the dyadic contract (docs/semantics.md is their prose twin).

Every backend reads these values from here (Python) or from
``backends/include/dyadic_core.h`` (C/CUDA); ``tests/spec/test_spec_constants.py``
checks that the two agree.
"""

#: Total ticket mass M of every dyadic row: q(v) = counts[v] / TOTAL.
TOTAL = 1 << 24
TOTAL_BITS = 24

#: Integer draft weights are scaled so that the largest weight is < 2**WEIGHT_BITS
#: (exactly 2**39 for the max logit); TOTAL * weight then fits in uint64.
WEIGHT_BITS = 39

#: Target probabilities become P_v = floor(p_v * 2**TARGET_BITS).
TARGET_BITS = 62
#: A target row must sum to 1 within 2**-TARGET_TOL_BITS (checked exactly on P).
TARGET_TOL_BITS = 10

#: A logit further than this below the row maximum (after bias and temperature)
#: gets integer weight 0 (exp(-32) * 2**39 < 1 anyway).
EXP_CUTOFF = 32.0

#: Largest vocabulary accepted (sum of weights < 2**63, sparse ids fit int32).
MAX_VOCAB = 1 << 24

# Philox counter word 0 = (domain << DOMAIN_SHIFT) | draw_index.
DOMAIN_SHIFT = 28
MAX_DRAW_INDEX = (1 << DOMAIN_SHIFT) - 1
DOMAIN_PROPOSAL = 1
DOMAIN_ACCEPTANCE = 2
DOMAIN_CORRECTION = 3  # correction and bonus tokens

#: Ranges of the key fields (inclusive upper bounds).
SEED_MAX = (1 << 64) - 1
GENERATION_MAX = (1 << 32) - 1
ROUND_MAX = (1 << 32) - 1
POSITION_MAX = (1 << 32) - 1

POLICY_STANDARD = "standard"
POLICY_FLOOR_FIRST = "floor-first"
SEMANTIC_IDS = {
    POLICY_STANDARD: "dyadic24-standard-v1",
    POLICY_FLOOR_FIRST: "dyadic24-floor-first-v1",
}
#: Integer code of each policy as passed to kernels.
POLICY_CODES = {POLICY_STANDARD: 0, POLICY_FLOOR_FIRST: 1}

#: Sparse rows are padded at the end with this id and a zero count.
PAD_ID = -1
