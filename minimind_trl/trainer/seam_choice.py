"""The functions a config's three seams pick: `advantage_estimator`, `loss_type`, `loss_aggregation`.

`resolve_seam_names` imports and registers `package.module:function` values (`Seam.resolve`); the config calls it
before it validates the names, so a recipe or a command line can name a function of any importable module, in
every process of `accelerate launch`. `seam_rows` names the function each seam runs, for the model card and the
run record (`minimind_run.json`), so a resume that would run another function is refused like a changed reward.
"""

from .advantages import ADVANTAGE_SEAM
from .loss_aggregation import LOSS_AGGREGATION_SEAM, effective_loss_aggregation
from .policy_losses import POLICY_LOSS_SEAM, TRL_LOSS_TYPES

SEAMS = (ADVANTAGE_SEAM, POLICY_LOSS_SEAM, LOSS_AGGREGATION_SEAM)


def resolve_seam_names(args) -> None:
    """Import and register every seam value of `args` that is a `package.module:function` (one `ExtensionError`
    line naming the key and the value when it cannot be used)."""
    for seam in SEAMS:
        value = getattr(args, seam.key, None)
        if value is not None:
            seam.resolve(value)


def seam_rows(args) -> list[tuple[str, str, str]]:
    """(config key, the name in effect, the function that runs) for each seam; TRL's own code as `trl:...`."""
    loss_type = args.loss_type
    if loss_type in TRL_LOSS_TYPES:
        aggregation = (effective_loss_aggregation(loss_type, None), f"trl:GRPOTrainer ({loss_type})")
    else:
        name = effective_loss_aggregation(loss_type, args.loss_aggregation)
        aggregation = (name, LOSS_AGGREGATION_SEAM.function_name(name))
    estimator = args.advantage_estimator
    return [
        ("advantage_estimator", estimator, ADVANTAGE_SEAM.function_name(estimator)),
        ("loss_type", loss_type, POLICY_LOSS_SEAM.function_name(loss_type)),
        ("loss_aggregation", *aggregation),
    ]


def seam_run_identity(args) -> dict[str, str]:
    """The run record's `<key>_function` entries: the function each seam runs (see `run_identity.py`)."""
    return {f"{key}_function": function for key, _, function in seam_rows(args)}


__all__ = ["SEAMS", "resolve_seam_names", "seam_rows", "seam_run_identity"]
