"""Many concurrent runs on a few worker processes: ``bench/concurrency.py`` is the entry point.

One module per job: ``server`` (the thinking model), ``procs`` (worker and server processes),
``resources`` (the bench's own database and Redis db), ``sample`` (RSS, CPU, connections),
``phase`` (one measured batch of runs), ``report`` (the figures as text or JSON)."""
