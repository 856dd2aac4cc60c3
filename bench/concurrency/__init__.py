"""Many concurrent runs on a few worker processes (``python -m bench.concurrency``).

One module per job: ``thinking_model`` (the model), ``resources`` (the bench's own database and Redis
db, the workers' environment), ``sample`` (RSS, CPU, connections), ``phase`` (one measured batch of
runs), ``figures`` (the figures as text or JSON); the processes are bench.common's."""
