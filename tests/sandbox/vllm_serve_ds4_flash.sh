#!/bin/bash
# /usr/local/bin/serve-ds4-flash.sh in the sandbox's vLLM (CPU) image: the stand-in for deployment A's image
# script. The real one builds vLLM's command line from the environment the unit sets; it is not public. This
# is the toolkit's reading of seed 000, the env contract the deploy writes:
#
#   MODEL_PATH                 the model directory, vLLM's positional model      (required)
#   SERVED_MODEL_NAME          --served-model-name
#   TP_SIZE                    --tensor-parallel-size
#   HOST                       --host                    (default 127.0.0.1)
#   PORT                       --port
#   MAX_MODEL_LEN              --max-model-len
#   MAX_NUM_SEQS               --max-num-seqs
#   MAX_NUM_BATCHED_TOKENS     --max-num-batched-tokens
#   GPU_MEMORY_UTILIZATION     --gpu-memory-utilization  (the CPU build's parser accepts it; its KV cache
#                                                         size is VLLM_CPU_KVCACHE_SPACE, the image's ENV)
#   KV_OFFLOADING_SIZE, BACKEND, MODE, LOAD_FORMAT, INSTANTTENSOR_BACKEND, DCP_SIZE, DSPARK_*
#                              GPU-only features of the real image: each one that is set is logged as
#                              "ignored on the CPU stand-in", never dropped silently
#
# Always added, whatever the env: tool calls (hermes parser) and strict JSON (xgrammar, no free whitespace),
# which the serving gate needs. There is deliberately no VLLM_EXTRA_ARGS: the command line is a function of
# the contract above alone, so what the deploy writes is all that decides what runs.
set -euo pipefail
me=serve-ds4-flash.sh
say() { printf '%s: %s\n' "$me" "$*" >&2; }

[ -n "${MODEL_PATH:-}" ] || { say "MODEL_PATH is not set: nothing to serve"; exit 2; }
args=(serve "$MODEL_PATH" --host "${HOST:-127.0.0.1}")
add() {  # add FLAG VAR: the flag with the variable's value, when it is set and not empty
  local v=${!2:-}
  [ -z "$v" ] || args+=("$1" "$v")
}
add --served-model-name SERVED_MODEL_NAME
add --tensor-parallel-size TP_SIZE
add --port PORT
add --max-model-len MAX_MODEL_LEN
add --max-num-seqs MAX_NUM_SEQS
add --max-num-batched-tokens MAX_NUM_BATCHED_TOKENS
add --gpu-memory-utilization GPU_MEMORY_UTILIZATION

for v in KV_OFFLOADING_SIZE BACKEND MODE LOAD_FORMAT INSTANTTENSOR_BACKEND DCP_SIZE $(compgen -e | grep '^DSPARK_' || true); do
  [ -z "${!v:-}" ] || say "$v=${!v} ignored on the CPU stand-in (a GPU-only feature of the real image)"
done

args+=(--enable-auto-tool-choice --tool-call-parser hermes
       --structured-outputs-config.backend xgrammar --structured-outputs-config.disable_any_whitespace true)
say "exec vllm $(printf '%q ' "${args[@]}")"
exec vllm "${args[@]}"
