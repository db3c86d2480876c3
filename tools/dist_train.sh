#!/usr/bin/env bash
# Distributed training on PyTorch's own launcher (torchrun).
#   tools/dist_train.sh CONFIG GPUS [train.py options]
# Several nodes: the same command on every node, GPUS per node; torchrun's c10d rendezvous at
# MASTER_ADDR:PORT (a host all nodes reach) numbers the nodes:
#   NNODES=2 MASTER_ADDR=host0 PORT=29500 tools/dist_train.sh CONFIG 8 [train.py options]
# RDZV_ID names the job at that endpoint (default deepvit_mm). With NODE_RANK=0|1|... set on each
# node, the nodes are numbered by hand instead (static rendezvous, node 0 at MASTER_ADDR:PORT).
# MAX_RESTARTS=N: when a worker or node fails, torchrun restarts the whole group up to N times;
# with --resume each restart continues from the newest complete checkpoint (docs/training.md).
set -euo pipefail
CONFIG=$1
GPUS=$2
shift 2
NNODES=${NNODES:-1}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
DIR=$(dirname "$0")
if [ "$NNODES" -gt 1 ] && [ -z "${NODE_RANK:-}" ]; then
  RDZV=(--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$PORT" --rdzv-id="${RDZV_ID:-deepvit_mm}")
  # a fresh store for each rendezvous round: in the store torchrun shares across rounds a restarted
  # group finds the failed group's keys (or, when node ranks change, two stores) and hangs
  export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}
else
  RDZV=(--node_rank="${NODE_RANK:-0}" --master_addr="$MASTER_ADDR" --master_port="$PORT")
fi
PYTHONPATH="$DIR/..:${PYTHONPATH:-}" exec python -m torch.distributed.run \
  --nnodes="$NNODES" --nproc_per_node="$GPUS" --max-restarts="${MAX_RESTARTS:-0}" "${RDZV[@]}" \
  "$DIR/train.py" "$CONFIG" --launcher pytorch "$@"
