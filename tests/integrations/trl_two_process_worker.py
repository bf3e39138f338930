"""One rank of the two-process TargetPOTrainer test (run by torchrun; writes rank 0's gradients)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist
from safetensors.torch import save_file
from trl_toys import trainer_grads

from tpo_gym.integrations.trl import TargetPOConfig, TargetPOTrainer


def main(out: Path) -> None:
    runs = {
        # 6 rows a rank: group 1 = rows 4..7 lies on both ranks
        "weights": {"n_prompts": 3, "per_device_train_batch_size": 3, "gradient_accumulation_steps": 2,
                    "target_update": "weights"},
        "groups": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "target_update": "groups"},
    }
    for name, config in runs.items():
        grads = trainer_grads(TargetPOTrainer, TargetPOConfig, str(out / f"{name}-run"), **config)
        if not dist.is_initialized() or dist.get_rank() == 0:
            save_file({k: v.contiguous() for k, v in grads.items()}, str(out / f"{name}.safetensors"))
    if dist.is_initialized():  # an undestroyed gloo group can abort the interpreter's exit ("terminate called")
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
