"""Framework integrations: callbacks that give a framework's training loop what ``Session.loop`` gives
a hand-written one (step timings, heartbeats, evaluation that is not a hang, emergency checkpoints on
SIGTERM/SIGUSR1), while the framework keeps owning checkpoints and resume.

- ``stalwart.integrations.lightning.StalwartCallback`` (extra ``lightning``)
- ``stalwart.integrations.hf.StalwartCallback`` (extra ``hf``: transformers' ``Trainer``)

Both talk to the agent through ``stalwart.integrations.link.StepLink``, the one place that touches the
SDK's step primitives.
"""
