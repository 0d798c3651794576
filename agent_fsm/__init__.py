"""agent-fsm: a declared, crash-safe state machine for a systemd node agent that upgrades itself."""

__version__ = "0.1.0"
