#!/usr/bin/env bash
# The GPU checks in one short run on a CUDA machine (docs/benchmarks.md, "On a GPU", holds their numbers):
#   1. the trainer's and the evaluator's tests on CUDA (tests/test_train.py, tests/test_evaluate.py: learning,
#      determinism, exact resume, scoring on the GPU, and the torch.compile smoke test, compiled against eager), and
#      how far compiled lands from eager per precision (benchmarks/compile_vs_eager.py);
#   2. model FLOPs utilisation of the transformer at three sizes, eager and compiled (benchmarks/mfu.py);
#   3. the GPU profile (profiles/wikitext2-gpu.yaml): each of its five models, compiled as the profile says, for a
#      short token budget, scored as the evaluate stage scores;
#   4. Muon's optimiser step, batched (lmpipe.muon) against torch.optim.Muon, on the profile's models;
#   5. the Trainer beside nanoGPT's model.py at 12 x 768, T 1024 (benchmarks/vs_nanogpt.py), from $NANOGPT: a folder
#      holding karpathy/nanoGPT's model.py, fetched beforehand (default .gpu/nanoGPT; never committed).
# It needs torch with CUDA, pydantic, PyYAML, numpy, tqdm and pytest, the default corpus's tokens (data/tokens: dvc
# repro tokenize) and the profile applied to params.yaml as one file, made where lmpipe is installed:
#   lmpipe profile profiles/wikitext2-gpu.yaml --write .gpu/wikitext2-gpu-params.yaml
# Outputs go to $OUT (default /tmp/gpu-check); PARAMS, PROFILE_TOKENS, MFU_STEPS and the *_TIMEOUT variables below
# change what it runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}; PARAMS=${PARAMS:-.gpu/wikitext2-gpu-params.yaml}; TOKENS=${PROFILE_TOKENS:-2000000}
MFU_STEPS=${MFU_STEPS:-100}; NANOGPT=${NANOGPT:-.gpu/nanoGPT}
mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'device',
torch.cuda.get_device_name() if torch.cuda.is_available() else 'none')"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null

echo "== 1. the trainer's tests on $(python3 -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')"): the compile smoke test first"
for tests in "compiled" "not compiled"; do
  timeout "${TEST_TIMEOUT:-100}" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE tests/test_train.py \
    tests/test_evaluate.py -k "$tests" --junitxml "$OUT/tests-${tests// /_}.xml" 2>&1 | tail -15
done
timeout "${DIAG_TIMEOUT:-130}" python3 benchmarks/compile_vs_eager.py 2>&1 | grep -v Warning

echo "== 2. MFU, eager then torch.compile"
timeout "${MFU_TIMEOUT:-60}" python3 benchmarks/mfu.py --steps "$MFU_STEPS"
timeout "${MFU_COMPILE_TIMEOUT:-150}" python3 benchmarks/mfu.py --steps "$MFU_STEPS" --compile

echo "== 3. the GPU profile ($PARAMS), $TOKENS tokens a model, the five side by side"
for model in nplm rnn lstm gru transformer; do
  timeout "${PROFILE_TIMEOUT:-150}" python3 -m lmpipe.train --model "$model" --params "$PARAMS" \
    --budget "{tokens: $TOKENS}" --score --out "/tmp/gpu-profile/$model" --checkpoints /tmp/gpu-ckpt \
    >"$OUT/profile-$model.log" 2>&1 &
done
wait
for model in nplm rnn lstm gru transformer; do
  python3 - "$OUT/profile-$model.log" "/tmp/gpu-profile/$model/metrics.json" "$model" <<'EOF'
import json, sys
from pathlib import Path
log, metrics, model = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
lines = log.read_text().splitlines()
scored = [json.loads(line) for line in lines if line.startswith("{") and "test_bpb" in line]
if not scored or not metrics.exists():
    sys.exit(print(f"{model:>12}: FAILED: " + " | ".join(lines[-3:])))
m = json.loads(metrics.read_text())
mfu = f"{100 * m['mfu']:.2f}%" if m.get("mfu") is not None else "-"
print(f"{model:>12}: {m['n_params']:>11,} params, {m['tokens_seen']:>9,} tokens in {m['seconds']:6.1f} s "
      f"({m['tokens_per_sec']:>9,.0f} tokens/s, MFU {mfu}, {m['precision']}), valid bpb {scored[-1]['valid_bpb']:.4f}, "
      f"test bpb {scored[-1]['test_bpb']:.4f}")
EOF
done

echo "== 4. Muon's step: lmpipe.muon.BatchedMuon against torch.optim.Muon, the profile's models"
timeout "${MUON_TIMEOUT:-60}" python3 benchmarks/muon.py --params "$PARAMS" --steps 50 --rounds 3

echo "== 5. the Trainer beside nanoGPT's model.py ($NANOGPT), 12 x 768, T 1024: B 16 and B 64, compiled"
if [ -f "$NANOGPT/model.py" ]; then
  for batch in 16 64; do
    timeout "${NANOGPT_TIMEOUT:-120}" python3 benchmarks/vs_nanogpt.py --nanogpt "$NANOGPT" --layers 12 --dim 768 \
      --heads 12 --seq-len 1024 --batch "$batch" --steps 20 --warmup 10 --rounds 2 --compile 2>&1 | grep -v Warning
  done
else
  echo "skipped: no $NANOGPT/model.py (the GPU machine has no network: put karpathy/nanoGPT's model.py there first)"
fi
