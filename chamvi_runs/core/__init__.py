"""The pure core of chamvi_runs: no Django, RQ, Channels or openai imports here."""
