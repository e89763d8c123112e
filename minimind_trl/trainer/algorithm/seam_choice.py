"""The functions a config's three seams pick: `advantage_estimator`, `loss_type`, `loss_aggregation`.

`resolve_seam_names` imports and registers `package.module:function` values (`Seam.resolve`); the config calls it
before it validates the names, so a recipe or a command line can name a function of any importable module, in
every process of `accelerate launch`. `seam_rows` names the function each seam runs, for the model card and the
run record (`minimind_run.json`), so a resume that would run another function is refused like a changed reward.
`check_seam_choices` is the config's check of the three names (and of the TRL options they make meaningless).
"""

import json

from ...errors import RecipeError
from .advantages import ADVANTAGE_ESTIMATORS, ADVANTAGE_SEAM, TRL_ADVANTAGES
from .loss_aggregation import LOSS_AGGREGATION_SEAM, LOSS_AGGREGATIONS, TRL_LOSS_AGGREGATION, effective_loss_aggregation
from .policy_losses import POLICY_LOSS_SEAM, POLICY_LOSSES, TRL_LOSS_TYPES, check_loss_kwargs

SEAMS = (ADVANTAGE_SEAM, POLICY_LOSS_SEAM, LOSS_AGGREGATION_SEAM)


def resolve_seam_names(args) -> None:
    """Import and register every seam value of `args` that is a `package.module:function` (one `ExtensionError`
    line naming the key and the value when it cannot be used)."""
    for seam in SEAMS:
        value = getattr(args, seam.key, None)
        if value is not None:
            seam.resolve(value)


def seam_rows(args) -> list[tuple[str, str, str]]:
    """(config key, the name in effect, the function that runs) for each seam; TRL's own code as `trl:...`. The
    loss's keyword arguments in effect (`loss_kwargs`, its declared defaults with the recipe's over them) follow
    its name in the model card; the run record keeps them with the training settings
    (`run_safety.recipe_settings`), where a resume that changes them is refused like a changed `beta`."""
    loss_type = args.loss_type
    if loss_type in TRL_LOSS_TYPES:
        aggregation = (effective_loss_aggregation(loss_type, None), f"trl:GRPOTrainer ({loss_type})")
    else:
        name = effective_loss_aggregation(loss_type, args.loss_aggregation)
        aggregation = (name, LOSS_AGGREGATION_SEAM.function_name(name))
    estimator = args.advantage_estimator
    return [
        ("advantage_estimator", estimator, ADVANTAGE_SEAM.function_name(estimator)),
        ("loss_type", _with_kwargs(loss_type, check_loss_kwargs(args)), POLICY_LOSS_SEAM.function_name(loss_type)),
        ("loss_aggregation", *aggregation),
    ]


def _with_kwargs(name: str, kwargs: dict) -> str:
    return name if not kwargs else f"{name} {json.dumps(kwargs, sort_keys=True)}"


def seam_run_identity(args) -> dict[str, str]:
    """The run record's `<key>_function` entries: the function each seam runs (see `run_identity.py`)."""
    return {f"{key}_function": function for key, _, function in seam_rows(args)}


def check_seam_choices(args) -> None:
    """The estimator, loss and aggregation `args` name exist (after importing `module:function` values) and fit
    together and with TRL's options: one error naming the setting that would have no effect or act twice."""
    resolve_seam_names(args)  # `package.module:function` values imported and registered before the checks
    estimators = (TRL_ADVANTAGES, *ADVANTAGE_ESTIMATORS)
    if args.advantage_estimator not in estimators:
        raise ValueError(f"advantage_estimator must be one of {estimators}, got {args.advantage_estimator!r}.")
    if args.advantage_estimator != TRL_ADVANTAGES:
        if args.scale_rewards != "group":
            raise ValueError(
                f"scale_rewards={args.scale_rewards!r} has no effect with advantage_estimator="
                f"{args.advantage_estimator!r} (a registered estimator computes the advantages from the "
                "rewards). Use advantage_estimator='trl' for TRL's scaling."
            )
        if args.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"multi_objective_aggregation={args.multi_objective_aggregation!r} has no effect with "
                f"advantage_estimator={args.advantage_estimator!r}, which normalises the weighted sum of the "
                "rewards. Use advantage_estimator='trl' for TRL's aggregation."
            )
    if args.loss_type not in TRL_LOSS_TYPES and args.loss_type not in POLICY_LOSSES:
        raise ValueError(
            f"loss_type must be one of TRL's {TRL_LOSS_TYPES} or a registered policy loss "
            f"{tuple(POLICY_LOSSES)}, got {args.loss_type!r}."
        )
    if args.loss_aggregation is not None:
        if args.loss_type in TRL_LOSS_TYPES:
            raise ValueError(
                f"loss_aggregation={args.loss_aggregation!r} has no effect with TRL's loss_type "
                f"{args.loss_type!r}, which aggregates as {TRL_LOSS_AGGREGATION[args.loss_type]!r}; leave it unset "
                "(or pick a registered loss_type such as 'minimind3_cispo')."
            )
        if args.loss_aggregation not in LOSS_AGGREGATIONS:
            raise ValueError(
                f"loss_aggregation must be one of {tuple(LOSS_AGGREGATIONS)}, got {args.loss_aggregation!r}."
            )
    if args.use_vllm and args.loss_type not in TRL_LOSS_TYPES and args.vllm_importance_sampling_correction:
        raise RecipeError(
            f"loss_type {args.loss_type} with use_vllm: its ratio takes vLLM's own log-probs as the old ones (as "
            "upstream MiniMind-3 takes SGLang's), so it already weighs every token by how vLLM sampled it; TRL's "
            "vllm_importance_sampling_correction would weigh it twice. Set vllm_importance_sampling_correction: "
            "false."
        )


__all__ = ["SEAMS", "check_seam_choices", "resolve_seam_names", "seam_rows", "seam_run_identity"]
