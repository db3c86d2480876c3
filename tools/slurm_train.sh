#!/usr/bin/env bash
# Distributed training under Slurm: one srun task per GPU, mmengine's slurm launcher (it reads
# SLURM_PROCID, SLURM_NTASKS and SLURM_NODELIST; MASTER_PORT, default 29500, picks the port).
#   tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py options]
# e.g. GPUS=16 tools/slurm_train.sh dev xcit_s12 configs/mask_rcnn_xcit_s12_8_3x.py work_dirs/s12
# Environment: GPUS (tasks, default 8), GPUS_PER_NODE (default 8), CPUS_PER_TASK (default 5),
# SRUN_ARGS (more srun options, e.g. "--quotatype=reserved").
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [train.py options]" >&2
  exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
DIR=$(dirname "$0")
# shellcheck disable=SC2086  # SRUN_ARGS holds several options
PYTHONPATH="$DIR/..:${PYTHONPATH:-}" exec srun -p "$PARTITION" \
  --job-name="$JOB_NAME" \
  --gres=gpu:"$GPUS_PER_NODE" \
  --ntasks="$GPUS" \
  --ntasks-per-node="$GPUS_PER_NODE" \
  --cpus-per-task="$CPUS_PER_TASK" \
  --kill-on-bad-exit=1 \
  $SRUN_ARGS \
  python -u "$DIR/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher=slurm "$@"
