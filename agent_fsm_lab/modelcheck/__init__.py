"""An exhaustive model check of one node: breadth-first over every configuration
reachable within a bound, running the real engine, effects, daemon, start check and `recover`
on real files, with only the process boundary modelled (which process runs and whose code it
is, systemd's units, the faults). See docs/reliability.md, "The model check"."""
