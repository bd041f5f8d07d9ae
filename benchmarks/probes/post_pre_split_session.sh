#!/usr/bin/env bash
# mhc_post_pre's cute passes with SPLIT CTAs a row tile: the split configs checked against the default
# (post_pre_split_check.py), then timed beside it in the harness (mhc_post_pre_variants.py, kernel table).
# Both toolchains in one process: a first call sources .gpu-cutile/env.sh (unpacks cuTile into /tmp/tk-cutile),
# this one carries .gpu-cute:   bash benchmarks/probes/post_pre_split_session.sh
source .gpu-cute/env.sh
export PYTHONPATH=$PYTHONPATH:/tmp/tk-cutile/site PATH=/tmp/tk-cutile/cu13/bin:$PATH
unset CUDA_HOME CUDA_PATH
. benchmarks/probes/_steps.sh
step check "${CHECK_S:-240}" python3 benchmarks/probes/post_pre_split_check.py ${CHECK_ARGS:-}
step time "${TIME_S:-300}" python3 benchmarks/probes/mhc_post_pre_variants.py --out "$OUT" \
  --rows "${ROWS:-cute,cute:FWD_SPLIT=2:SPLIT=2,cute:FWD_SPLIT=4:SPLIT=4,cute:FWD_SPLIT=2,cute:SPLIT=2,cute,cute:FWD_SPLIT=2:SPLIT=2}" ${TIME_ARGS:-}
cat "$SUM"
tail -12 "$OUT/check.log"
cut -c1-120 "$OUT/time.log" | tail -110
