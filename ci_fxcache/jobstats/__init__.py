"""The job's own compiles, observed: torch's structured trace (TORCH_TRACE) of every process of
the job, read with bounds, counted, each miss explained against the entries the scope recorded,
and a bounded per-scope history. Nothing here imports torch; the trace is untrusted input (the
job's code writes it) and is trusted for nothing but the figures it shows."""
