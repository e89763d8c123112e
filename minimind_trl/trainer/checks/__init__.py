"""Checks on what a user hands the trainer, before any model loads: every numeric setting's range, the optional
packages a recipe switches on, the model and reward functions, the constructor's one pass over its config, and
whether the launch partitions the weights."""
