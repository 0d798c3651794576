"""`python -m agent_fsm_lab`: the lab's command line (`cli`)."""

from agent_fsm_lab.cli import main

main()
