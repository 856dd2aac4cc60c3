"""Pieces of the latency benchmarks (``bench/stream_latency.py``, ``bench/recovery.py``): a model
server that stamps its chunks, the process stack, websocket client processes, and statistics."""
