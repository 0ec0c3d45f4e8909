#!/usr/bin/env bash
# Per-kernel device durations (ncu, clocks left alone) of every backend="cuda" op, plus a
# warp-sampling source profile of chosen kernels.  Logs under $OUT (default ./gpu-out).
#   PROFILE_KERNELS="dc_topk dc_v1" tools/gpu_profile.sh
set -o pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
NCU=${NCU:-ncu}
{
echo "== durations"
timeout ${DUR_T:-240} $NCU --clock-control none --metrics gpu__time_duration.sum --csv \
    python3 tools/gpu_profile_ops.py ${PROFILE_OPS:-} > "$OUT/ncu_durations.csv" 2> "$OUT/ncu_durations.err"
echo "ncu exit $?"; tail -5 "$OUT/ncu_durations.err"; rm -f "$OUT/ncu_durations.err"
python3 - "$OUT/ncu_durations.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print(open(sys.argv[1]).read()[-3000:]); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); gi = h.index("Grid Size") if "Grid Size" in h else None
d = collections.OrderedDict()
for r in rows[1:]:
    key = (r[ki][:40], r[gi] if gi is not None else "")
    d.setdefault(key, []).append(float(r[vi].replace(",", "")))
for (k, gsz), v in d.items():
    v = sorted(v)
    print(f"{k:40s} grid {gsz:16s} n={len(v):3d} median {v[len(v)//2]/1e3:8.2f} us  min {v[0]/1e3:8.2f}")
PY
for K in ${PROFILE_KERNELS:-}; do
  echo "== source profile $K (ops ${PROFILE_KOPS:-propose1})"
  timeout ${SRC_T:-200} $NCU --clock-control none --set full --import-source yes -k regex:"^$K\$" --launch-skip 1 --launch-count 1 \
      -o "$OUT/prof_$K" python3 tools/gpu_profile_ops.py ${PROFILE_KOPS:-propose1} > "$OUT/prof_$K.log" 2>&1
  echo "ncu exit $?"; tail -3 "$OUT/prof_$K.log"; rm -f "$OUT/prof_$K.log"
  $NCU --import "$OUT/prof_$K.ncu-rep" --page source --csv --print-source sass > "$OUT/src_$K.csv" 2>&1
  $NCU --import "$OUT/prof_$K.ncu-rep" --page details > "$OUT/det_$K.txt" 2>&1
  rm -f "$OUT/prof_$K.ncu-rep"
  head -c 400 "$OUT/src_$K.csv"; echo
done
} 2>&1 | tee "$OUT/profile_log.txt"
