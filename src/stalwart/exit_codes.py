"""Exit codes of ``stalwart run``: each tells a scheduler whether a requeue can help.

| code | meaning | requeue helps |
|---|---|---|
| 0 | training finished | - |
| 2 | bad input (flags, config, fault plan, missing script) | no |
| 3 | user error: the training script fails deterministically | no |
| 75 | infrastructure failures used up the restart budget, or rendezvous failed | yes |
| 76 | preempted: an emergency checkpoint was saved, resume by requeueing | yes |
| 77 | (worker to agent only) stopped on request, but its emergency checkpoint did not commit | - |
| 130 | interrupted by the operator (Ctrl-C) | no |
"""

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_USER_ERROR = 3
EXIT_INFRA = 75
EXIT_PREEMPTED = 76
EXIT_PREEMPTED_UNSAVED = 77  # a worker's exit to its agent, never the job's: the job then exits 75
EXIT_INTERRUPTED = 130

REQUEUE_HELPS = {EXIT_INFRA: True, EXIT_PREEMPTED: True}
