"""GRPO's arithmetic as registries a recipe picks by name: advantage estimators, policy losses, loss aggregations
(`seams`, `seam_choice`), and DAPO's dynamic sampling."""
