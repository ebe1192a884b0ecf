"""What the study plans before any run: the vocabulary of designs and metrics with their
margins, the profiles, the learning-rate policy, the published references, the experiments
and the threads' claims each one tests. Nothing here reads the results store's results, except
the learning rates a tuning profile's comparisons are trained at."""
