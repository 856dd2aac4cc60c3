"""PostgreSQL connections a daphne web process holds after N page loads, per connection setting:
``python -m bench.conn_leak``. ``measure`` and ``prepare`` serve tests/system/test_conn_leak.py too."""

from bench.conn_leak.pages import Server, measure, prepare

__all__ = ["Server", "measure", "prepare"]
