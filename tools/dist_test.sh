#!/usr/bin/env bash
# Distributed testing on PyTorch's own launcher (torchrun).
#   tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py options]
# Several nodes: NNODES=2 NODE_RANK=0|1 MASTER_ADDR=host0 PORT=29500 tools/dist_test.sh ...
set -euo pipefail
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
shift 3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
DIR=$(dirname "$0")
PYTHONPATH="$DIR/..:${PYTHONPATH:-}" exec python -m torch.distributed.run \
  --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
  --nproc_per_node="$GPUS" --master_port="$PORT" \
  "$DIR/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
