"""Applications behind the CLI: training, evaluation, demo, capacity planning, launching."""
