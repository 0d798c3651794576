"""The command line, the only layer that prints: entry.py is the console script, app.py the app."""
