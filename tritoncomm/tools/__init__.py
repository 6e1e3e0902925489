"""Tools built on the library, not part of it: the main job's correctness table (``demo``), the
benchmarks (``bench``, ``layers``, ``microbench``) with their baselines (``peers``) and timing
method (``timing``), the table tuner (``tune``), shared report helpers (``report``) and the command
line (``cli``, behind ``python -m tritoncomm``)."""
