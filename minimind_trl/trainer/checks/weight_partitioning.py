"""Whether the launch partitions the policy's weights across processes (DeepSpeed ZeRO-3, FSDP): each forward then
gathers them, so what runs a layer twice, compiles the forward or stops generating early must know it."""


def weight_partitioning(trainer) -> str | None:
    """"DeepSpeed ZeRO-3" or "FSDP" when `trainer`'s weights are partitioned, else None (ZeRO-1/2 and DDP keep them
    whole on every process)."""
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    if trainer.is_deepspeed_enabled and plugin is not None and plugin.zero_stage == 3:
        return "DeepSpeed ZeRO-3"
    if trainer.is_fsdp_enabled:
        return "FSDP"
    return None


__all__ = ["weight_partitioning"]
