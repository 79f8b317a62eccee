#!/usr/bin/env bash
# The GPU check (issue 20), one call on the H200 machine; bench/RESULTS.md "GPU check" says how.
#
#   bench/gpu_check.sh                 # on the GPU machine: results under $OUT (or --out DIR)
#   bench/gpu_check.sh --cpu-dry-run   # here: the same steps and code paths at a tiny size
#   bench/gpu_check.sh --only zero2-neo --micro-batch 64   # a rerun of some steps (wheels, env and
#                                        # manifest always run; --micro-batch stands in for the probe)
#
# Steps, each with its own time limit inside an overall deadline (a step that fails or runs out
# of time is recorded and the next one runs; the summary is always written). --step-limit-s S
# gives every step the limit S instead (still cut to the deadline): a dry run at low priority,
# as the test suite runs it, may wait long for a core.
#   wheels    install the carried wheels (.whl/: deepspeed + what the image lacks) into /tmp/site
#   env       GPU, driver, versions, this command
#   manifest  a real-text manifest from the carried text (bench/data/gpu/text.jsonl.gz)
#   probe     the largest micro-batch that fits (gpt2-124m, seq 1024), and the one whose steps fit the time
#   train     tokshard train --model gpt2-124m, bf16, 300 steps, --log-every 1 (per-step data wait)
#   nanogpt   the same engine and steps with nanoGPT's get_batch
#   loader    tokshard's Prefetcher alone: samples/s per rank
#   starved   tokshard train on a tiny model and a 2048-id synthetic manifest: steps shorter than batches
#   zero3-opt    trainer/configs/zero3-opt.json with hf:opt-125m, a few steps
#   cpu-adam     DeepSpeed's CPUAdam JIT build, timed (fresh extensions folder)
#   zero2-neo    trainer/configs/gpt-neo-2.7b-zero2-offload-fp16.json with hf:gpt-neo-2.7b, a few steps
#   compile-eager-MB, compile-on-MB   (issue 34) the train run without and with --compile at each
#                micro-batch of COMPILE_MICROS (select them all with --only compile)
#   flex      --doc-mask's FlexAttention against the dense SDPA mask on one batch (loss, gradients) and
#             its step cost against causal attention at seq 1024, 2048, 4096 (bench/bench_docmask.py)
#   packed    the train run with --packing best-fit --doc-mask (when the trainer has --packing)
#   report    summary.json + summary.md
# Files under OUT (8 at most, none in folders): gpu_check.log, summary.json, summary.md and the
# metrics.jsonl of each run (train, nanogpt, starved, zero3-opt, zero2-neo); the issue-34 runs'
# metrics stay under WORK and reach OUT through summary.json.
set -u -o pipefail

COMMAND="bench/gpu_check.sh $*"
MODE=gpu
OUT_DIR=${OUT:-}
WORK=${GPU_CHECK_WORK:-/tmp/gpu-check}
TEXT=""
PY=${PYTHON:-python3}
DEADLINE_S=${GPU_CHECK_DEADLINE_S:-450}
STEP_LIMIT_S=""
ONLY=""
MICRO_GIVEN=""
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu-dry-run) MODE=cpu-dry-run ;;
        --out) OUT_DIR=$2; shift ;;
        --work) WORK=$2; shift ;;
        --text) TEXT=$2; shift ;;
        --deadline-s) DEADLINE_S=$2; shift ;;
        --step-limit-s) STEP_LIMIT_S=$2; shift ;;
        --only) ONLY=",$2,"; shift ;;
        --micro-batch) MICRO_GIVEN=$2; shift ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$OUT_DIR" ]; then
    echo "gpu_check.sh: no output folder: set OUT or pass --out DIR" >&2
    exit 2
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 2
TEXT=${TEXT:-$REPO/bench/data/gpu/text.jsonl.gz}
if [ ! -f "$TEXT" ]; then
    echo "gpu_check.sh: no text at $TEXT; run: python bench/gpu_carry.py text (or pass --text FILE.jsonl[.gz])" >&2
    exit 2
fi
rm -rf "$WORK"
mkdir -p "$OUT_DIR" "$WORK/runs"
exec > >(tee -a "$OUT_DIR/gpu_check.log") 2>&1
TEE=$!
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # the device reaches no hub: fail at once, never retry
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
START=$(date +%s)

if [ "$MODE" = gpu ]; then
    MODEL=(--model gpt2-124m); SEQ=1024; STEPS=300; WARMUP=20
    PROBE=(--candidates 8,16,32,64,128,256 --budget-s 45)
    LOADER=(--micro-batches 16,64,256 --batches 200)
    STARVED_MICRO=256; STARVED_STEPS=60; SYNTH_TOKENS=$((1 << 25))
    OPT=(--model hf:opt-125m --deepspeed trainer/configs/zero3-opt.json --steps 5 --seq-len 1024)
    NEO=(--model hf:gpt-neo-2.7b --deepspeed trainer/configs/gpt-neo-2.7b-zero2-offload-fp16.json
         --steps 3 --seq-len 2048)
    LIMITS=(wheels=120 env=60 manifest=120 probe=150 train=180 nanogpt=180 loader=90 starved=90
            zero3-opt=120 cpu-adam=180 zero2-neo=300 compile=240 flex=180 packed=150)
    COMPILE_MICROS="32 128"; COMPILE_STEPS=120
    FLEX=(--bf16 --layers 12 --width 768 --heads 12 --vocab 50304 --seqs 1024,2048,4096 --batch 8 --steps 10)
    export DS_ACCELERATOR=cuda
    export TORCH_EXTENSIONS_DIR=$WORK/torch_extensions  # fresh: the CPUAdam build is timed from scratch
else
    # the same steps at a size two CPU cores run in a couple of minutes: the tiny GPT (with
    # GPT-2's vocabulary), shrunk OPT / GPT-Neo configs, fp32 instead of fp16 (no GPU here)
    MODEL=(--model tiny --vocab-size 50304); SEQ=64; STEPS=12; WARMUP=3
    PROBE=(--candidates 2,4 --budget-s 1000 --repeats 1)
    LOADER=(--micro-batches 4,16 --batches 20)
    STARVED_MICRO=16; STARVED_STEPS=6; SYNTH_TOKENS=$((1 << 18))
    OPT=(--model "hf:$WORK/opt-small.json" --deepspeed trainer/configs/zero3-opt.json --steps 2
         --seq-len 64 --micro-batch 2)
    NEO=(--model "hf:$WORK/neo-small.json" --deepspeed "$WORK/neo-fp32.json" --steps 2 --seq-len 64)
    LIMITS=(wheels=60 env=60 manifest=60 probe=90 train=90 nanogpt=90 loader=60 starved=90
            zero3-opt=90 cpu-adam=300 zero2-neo=120 compile=240 flex=90 packed=90)
    COMPILE_MICROS="2"; COMPILE_STEPS=6
    FLEX=(--layers 2 --width 64 --heads 2 --seqs 64,128 --batch 2 --steps 2)
    # every process imports as on the image: tokshard's code may use only the image's packages and
    # the carried ones (bench/gpu_carry.py ImageGuard; the first device call found orjson missing)
    export PYTHONPATH=$REPO/bench/image_guard:$PYTHONPATH
    # CPUAdam: the extensions folder as usual (the test suite's offload test builds it once)
fi

limit_of() {  # the step's own limit (or its group's: compile-on-32 -> compile), cut to what is left
    local name=$1 limit=60 spec left
    for spec in "${LIMITS[@]}"; do
        if [ "${spec%%=*}" = "$name" ] || [ "${spec%%=*}" = "${name%%-*}" ]; then
            limit=${spec#*=}
            break
        fi
    done
    limit=${STEP_LIMIT_S:-$limit}
    left=$((DEADLINE_S - ($(date +%s) - START)))
    echo $((limit < left ? limit : left))
}

# run_step NAME CMD...: the exact command in the log, its status and seconds in steps.jsonl
run_step() {
    local name=$1 limit t0 rc status
    shift
    limit=$(limit_of "$name")
    echo
    case "$name" in wheels|env|manifest) ;; *)
        if [ -n "$ONLY" ] && [[ "$ONLY" != *",$name,"* ]] && [[ "$ONLY" != *",${name%%-*},"* ]]; then
            printf '{"name": "%s", "status": "not selected (--only)", "seconds": 0, "command": "%s"}\n' \
                "$name" "$*" >>"$WORK/steps.jsonl"
            return 1
        fi ;;
    esac
    echo "=== $name (limit ${limit}s): $*"
    if [ "$limit" -lt 5 ]; then
        status="skipped: the ${DEADLINE_S}s deadline passed"
        printf '{"name": "%s", "status": "%s", "seconds": 0, "command": "%s"}\n' "$name" "$status" "$*" >>"$WORK/steps.jsonl"
        echo "=== $name: $status"
        return 1
    fi
    t0=$(date +%s%N)
    if declare -F "$1" >/dev/null; then
        "$@"  # a function of this script (the wheel install): no time limit of its own
    else
        timeout --kill-after=10 "$limit" "$@"
    fi
    rc=$?
    case $rc in
        0) status=ok ;;
        124|137) status="timed out after ${limit}s" ;;
        *) status="failed (exit $rc)" ;;
    esac
    local tenths=$((($(date +%s%N) - t0) / 100000000))
    printf '{"name": "%s", "status": "%s", "seconds": %d.%d, "command": "%s"}\n' "$name" "$status" \
        $((tenths / 10)) $((tenths % 10)) "$*" >>"$WORK/steps.jsonl"
    echo "=== $name: $status"
    [ $rc -eq 0 ]
}

# train_run NAME FLAGS...: `tokshard train` (python -m tokshard.cli train), per-step metrics to OUT
train_run() {
    local name=$1
    shift
    run_step "$name" "$PY" -m tokshard.cli train --run-dir "$WORK/runs/$name" --log-every 1 "$@"
    local rc=$?
    [ -f "$WORK/runs/$name/metrics.jsonl" ] && cp "$WORK/runs/$name/metrics.jsonl" "$OUT_DIR/$name-metrics.jsonl"
    return $rc
}

# work_run NAME FLAGS...: as train_run, its metrics kept under WORK (OUT holds 8 files at most)
work_run() {
    local name=$1
    shift
    run_step "$name" "$PY" -m tokshard.cli train --run-dir "$WORK/runs/$name" --log-every 1 "$@"
}

install_wheels() {  # the device README's carried-wheel install; the dry run checks the set instead
    if [ ! -d .whl ]; then
        echo "no .whl/ here: run python bench/gpu_carry.py wheels first"
        return 1
    fi
    "$PY" bench/gpu_carry.py check || return 1
    if [ "$MODE" = gpu ]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl || return 1
    fi
}

echo "gpu_check.sh ($MODE) $(date -u +%FT%TZ) in $REPO; work $WORK; out $OUT_DIR"
if [ "$MODE" = gpu ]; then
    run_step wheels install_wheels && export PYTHONPATH=/tmp/site:$PYTHONPATH
else
    if [ -d .whl ]; then run_step wheels install_wheels; fi
fi
run_step env "$PY" bench/gpu_check.py env --command "$COMMAND" \
    --commit "$(git rev-parse HEAD 2>/dev/null || echo n/a)" --result "$WORK/env.json"
nvidia-smi 2>/dev/null | head -20
M=$WORK/manifest/manifest.json
run_step manifest "$PY" bench/gpu_check.py manifest --text "$TEXT" --out "$WORK/manifest"

COMMON=(--manifest "$M" "${MODEL[@]}" --seq-len "$SEQ")
run_step probe "$PY" bench/gpu_check.py probe "${COMMON[@]}" --steps "$STEPS" "${PROBE[@]}" \
    --result "$WORK/probe.json"
MICRO=${MICRO_GIVEN:-$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['chosen'])" \
    "$WORK/probe.json" 2>/dev/null || echo "${PROBE[1]%%,*}")}
echo "micro-batch: $MICRO"

train_run train "${COMMON[@]}" --steps "$STEPS" --micro-batch "$MICRO"
run_step nanogpt "$PY" bench/gpu_check.py nanogpt "${COMMON[@]}" --steps "$STEPS" --micro-batch "$MICRO" \
    --metrics "$OUT_DIR/nanogpt-metrics.jsonl" --result "$WORK/nanogpt.json"
run_step loader "$PY" bench/gpu_check.py loader --manifest "$M" --seq-len "$SEQ" "${LOADER[@]}" \
    --result "$WORK/loader.json"
"$PY" bench/gpu_check.py synth --out "$WORK/synth" --tokens "$SYNTH_TOKENS" >/dev/null
train_run starved --manifest "$WORK/synth/manifest.json" --model tiny --seq-len "$SEQ" \
    --micro-batch "$STARVED_MICRO" --steps "$STARVED_STEPS"

if [ "$MODE" != gpu ]; then
    "$PY" bench/gpu_check.py shrink --config opt-125m --out "$WORK/opt-small.json" >/dev/null
    "$PY" bench/gpu_check.py shrink --config gpt-neo-2.7b --out "$WORK/neo-small.json" >/dev/null
    "$PY" bench/gpu_check.py without-fp16 --config trainer/configs/gpt-neo-2.7b-zero2-offload-fp16.json \
        --out "$WORK/neo-fp32.json" >/dev/null
fi
train_run zero3-opt --manifest "$M" "${OPT[@]}"
run_step cpu-adam "$PY" bench/gpu_check.py cpu-adam --result "$WORK/cpu-adam.json"
train_run zero2-neo --manifest "$M" "${NEO[@]}"

# issue 34: the model side (compile, FlexAttention, packed batches)
for mb in $COMPILE_MICROS; do
    work_run "compile-eager-$mb" "${COMMON[@]}" --steps "$COMPILE_STEPS" --micro-batch "$mb"
    work_run "compile-on-$mb" "${COMMON[@]}" --steps "$COMPILE_STEPS" --micro-batch "$mb" --compile
done
DEV=cpu; [ "$MODE" = gpu ] && DEV=cuda
run_step flex "$PY" bench/bench_docmask.py --device "$DEV" "${FLEX[@]}" --compare --result "$WORK/flex.json"
if "$PY" -m tokshard.cli train --help 2>/dev/null | grep -q -- --packing; then
    work_run packed "${COMMON[@]}" --steps "$COMPILE_STEPS" --micro-batch "$MICRO" --packing best-fit --doc-mask
fi

"$PY" bench/gpu_check.py report --work "$WORK" --out "$OUT_DIR" --mode "$MODE" --model "${MODEL[1]}" \
    --seq-len "$SEQ" --micro-batch "$MICRO" --starved-micro "$STARVED_MICRO" --warmup "$WARMUP" \
    --compile-micros "$COMPILE_MICROS"
echo "gpu_check.sh: done in $(($(date +%s) - START)) s; results in $OUT_DIR"
exec >&- 2>&-
wait "$TEE" 2>/dev/null  # the log is whole before the device collects OUT
