"""AG-UI (SPEC §15): ``POST chamvi/agui/<agent>/`` serves runs to AG-UI front ends, with the
``agui`` extra (``pip install chamvi-runs[agui]``). ``views`` takes the request, ``inputs`` reads
it, ``translate`` writes a run's events as AG-UI events. See docs/agui.md."""
