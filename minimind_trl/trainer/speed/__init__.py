"""What makes a step fast without changing what it computes: the lean sampler and its decode kernel, the
completion-only log-prob head, the CPU's precision choice, each prompt computed once per group."""
