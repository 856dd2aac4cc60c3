"""The pieces behind ``tests.scripted_server``; import from that facade, not from here."""
