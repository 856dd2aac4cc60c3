"""The pieces behind ``tests.support.scripted_server``; import from that facade, not from here."""
